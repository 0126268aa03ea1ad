"""BrokerWatch: notices a lost broker, says so once, gives up after broker_timeout."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

import flowkit
from flowkit.transports import watch as watch_module
from flowkit.transports.watch import BrokerWatch


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def listening() -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_hint_with_the_broker_reachable_is_no_outage() -> None:
    server, port = await listening()
    watch = BrokerWatch([f"127.0.0.1:{port}"], timeout=5)
    task = asyncio.create_task(watch.run())
    watch.hint()
    await asyncio.sleep(0.2)
    assert not watch.away and watch.outages == 0 and not task.done()
    task.cancel()
    server.close()


async def test_a_broker_away_too_long_raises_broker_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch_module, "PROBE_EVERY", 0.05)
    port = closed_port()
    watch = BrokerWatch([f"127.0.0.1:{port}"], timeout=0.3)
    task = asyncio.create_task(watch.run())
    watch.hint()
    with pytest.raises(flowkit.BrokerUnavailable, match=r"unreachable for .* s; gave up"):
        await asyncio.wait_for(task, 5)
    assert watch.away and watch.outages == 1
    watch.close()  # still away: its filter keeps dropping the clients' retries


async def test_a_broker_that_comes_back_ends_the_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_module, "PROBE_EVERY", 0.05)
    port = closed_port()
    watch = BrokerWatch([f"127.0.0.1:{port}"], timeout=10)
    task = asyncio.create_task(watch.run())
    watch.hint()
    await asyncio.sleep(0.2)
    assert watch.away
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
    await asyncio.sleep(0.3)
    assert not watch.away and watch.outages == 1 and not task.done()
    task.cancel()
    server.close()
    watch.close()


async def test_aiokafka_connection_errors_are_dropped_while_a_watch_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, port = await listening()
    watch = BrokerWatch([f"127.0.0.1:{port}"], timeout=5)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0)
    aiokafka_log = logging.getLogger("aiokafka")
    with caplog.at_level(logging.WARNING, logger="aiokafka"):
        aiokafka_log.error("Unable connect to node with id 111: Connect call failed")
        aiokafka_log.error("something else entirely")
    assert [r.getMessage() for r in caplog.records] == ["something else entirely"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    watch.close()  # the broker was never away: its lines are let through again
    server.close()
    assert watch not in watch_module._WATCHES
