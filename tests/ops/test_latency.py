"""End-to-end latency: observed when an agent's outputs are acknowledged, not at the commit;
the commit-inclusive figure apart. Tests never assert times: only when a figure is taken."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import flowkit
from flowkit.records import TopicPartition
from flowkit.runtime.output.publisher import Publisher
from flowkit.testing import TestDriver
from flowkit.transports import Ack, OutRecord
from flowkit.transports.memory import MemoryBroker, MemoryProducer, MemoryTransport
from tests.conftest import DriverFactory


class _HeldProducer(MemoryProducer):
    """Stores every record at once, but acknowledges a batch only once ``release`` is set."""

    def __init__(self, broker: MemoryBroker, release: asyncio.Event) -> None:
        super().__init__(broker)
        self.release = release

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        acks = await super().send_batch(topic, partition, records)

        async def later(ack: Awaitable[Ack]) -> Ack:
            await self.release.wait()
            return await ack

        return [(n, asyncio.ensure_future(later(ack))) for n, ack in acks]


class _HeldTransport(MemoryTransport):
    def __init__(self, release: asyncio.Event) -> None:
        super().__init__()
        self.release = release

    def producer(self, *, client_id: str = "flowkit") -> MemoryProducer:
        producer = _HeldProducer(self.broker, self.release)
        self._clients.append(producer)
        return producer


def _app() -> tuple[flowkit.App, flowkit.Topic[int]]:
    app = flowkit.App("latency-demo", partitions=1)
    numbers: flowkit.Topic[int] = app.topic("numbers", value_type=int)
    doubled: flowkit.Topic[int] = app.topic("doubled", value_type=int)

    @app.agent(numbers, sink=[doubled])
    async def double(stream: flowkit.Stream[int]) -> AsyncIterator[int]:
        async for n in stream:
            yield 2 * n

    return app, numbers


def _count(driver: TestDriver, metric: str) -> float:
    value = driver.worker.metrics.registry.get_sample_value(f"{metric}_count", {"agent": "double"})
    return value or 0.0


async def _until(condition: Any, rounds: int = 500, pause: float = 0.0) -> bool:
    for _ in range(rounds):  # a deadline: ``rounds`` turns of the event loop
        if condition():
            return True
        await asyncio.sleep(pause)
    return bool(condition())


async def test_latency_is_observed_at_the_ack_of_the_outputs_not_at_the_commit() -> None:
    app, numbers = _app()
    release = asyncio.Event()
    transport = _HeldTransport(release)
    out = TopicPartition("doubled", 0)
    async with TestDriver(app, transport=transport, commit_interval=3600) as driver:
        for n in range(3):
            await driver.send(numbers, n, timestamp_ms=int(driver.clock.time() * 1000))
        assert await _until(lambda: len(transport.broker.messages(*out)) == 3)
        # Stored, but not acknowledged: no observation yet.
        assert not await _until(lambda: _count(driver, "flowkit_e2e_latency_seconds") > 0, 50)
        release.set()
        assert await _until(lambda: _count(driver, "flowkit_e2e_latency_seconds") > 0)
        # No commit has happened (the interval is an hour): the commit-inclusive figure waits.
        assert _count(driver, "flowkit_committed_latency_seconds") == 0
        await driver.worker.checkpoint()
        assert _count(driver, "flowkit_committed_latency_seconds") >= 1
    await transport.aclose()


async def test_latency_is_observed_before_any_commit(make_driver: DriverFactory) -> None:
    app, numbers = _app()
    driver = make_driver(app, commit_interval=3600)
    async with driver:
        for n in range(3):
            await driver.send(numbers, n, timestamp_ms=int(time.time() * 1000))
        await driver.run_until_idle()
        assert sorted(await driver.values("doubled")) == [0, 2, 4]
        observed = lambda: _count(driver, "flowkit_e2e_latency_seconds") > 0  # noqa: E731
        assert await _until(observed, rounds=1000, pause=0.01)  # 10 s at most
        assert _count(driver, "flowkit_committed_latency_seconds") == 0


async def test_an_agent_that_sends_nothing_is_observed_once_done() -> None:
    app = flowkit.App("latency-quiet", partitions=1)
    numbers: flowkit.Topic[int] = app.topic("numbers", value_type=int)
    seen: list[int] = []

    @app.agent(numbers)
    async def double(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            seen.append(n)

    async with TestDriver(app, commit_interval=3600) as driver:
        await driver.send(numbers, 1, timestamp_ms=int(driver.clock.time() * 1000))
        await driver.run_until_idle()
        assert seen == [1]
        assert _count(driver, "flowkit_e2e_latency_seconds") == 1
        assert _count(driver, "flowkit_committed_latency_seconds") == 0


async def test_when_acknowledged_waits_for_the_round_that_sends_what_is_buffered() -> None:
    release = asyncio.Event()
    broker = MemoryBroker()
    broker.create_topic("t", 1)

    async def one_partition(topic: str) -> int:
        return 1

    publisher = Publisher(_HeldProducer(broker, release), partition_count=one_partition)
    calls: list[bool] = []
    publisher.publish("t", b"a", None, (), None)
    publisher.when_acknowledged(calls.append)
    assert calls == []  # buffered: not sent yet, nothing sent early either
    assert publisher.buffered == 1
    assert await _until(lambda: publisher.buffered == 0)  # the round the publish scheduled
    assert not await _until(lambda: bool(calls), 50)  # sent, not acknowledged
    release.set()
    assert await _until(lambda: bool(calls))
    assert calls == [True]
    publisher.when_acknowledged(calls.append)  # nothing pending: at once
    assert calls == [True, True]
    await publisher.await_acks()
