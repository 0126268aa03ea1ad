"""A checkpoint never writes a window's close to the changelog before the close's results
are sent (on the memory store, whose owner closes a window as its partials arrive)."""

from __future__ import annotations

import asyncio
from typing import Any

from flowkit.state.windowed.wire import EMITTED_KEY
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from tests.state.test_window_replays import Click, Closed, feed, make_app, results


async def test_a_checkpoint_while_closed_windows_wait_for_their_results_loses_none() -> None:
    # On Kafka, the record that says a batch of partials closed windows is acknowledged
    # before their results go out, and the fetcher waits for that acknowledgement. A
    # checkpoint that ran meanwhile wrote the close to the changelog before the results
    # were sent: a crash then left a closed window whose results never came out (its
    # partials, read again, were taken as a replay). The acknowledgement is held here, so
    # that the checkpoint comes at that moment.
    broker = MemoryBroker()
    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    start = now - now % 10_000
    closed: list[Closed] = []
    app, clicks = make_app(closed)
    driver = TestDriver(app, broker=broker, clock=clock, commit_interval=3600)
    await driver.__aenter__()
    await feed(driver, clicks, [start + 1, start + 2])
    state, held = driver.worker.state, asyncio.Event()
    send = state._send

    async def slow_emitted_ack(topic: str, value: Any, **kwargs: Any) -> Any:
        ack = await send(topic, value, **kwargs)
        if kwargs.get("key") != EMITTED_KEY:
            return ack
        held.set()
        return asyncio.get_running_loop().create_future()  # not acknowledged yet

    state._send = slow_emitted_ack
    await driver.send(clicks, Click("/", start + 10_001), key="/", timestamp_ms=start + 10_001)
    await asyncio.wait_for(held.wait(), 10)
    assert driver.worker.checkpointer is not None
    checkpoint = asyncio.ensure_future(driver.worker.checkpointer.checkpoint())
    for _ in range(50):  # as far as it can go while the results wait
        await asyncio.sleep(0)
    checkpoint.cancel()
    driver.worker._error = RuntimeError("simulated crash")  # no final commit, no flush
    await driver.aclose()
    assert results(broker) == []

    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        assert results(broker) == [(start, 2, True)]
