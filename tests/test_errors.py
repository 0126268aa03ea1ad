"""Error policies, dead letters, and sinks: retries, backpressure, independence."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import pytest

import flowkit
from flowkit.testing import TestDriver
from tests.conftest import DriverFactory


def numbers_app(name: str = "e", **agent_options: Any) -> tuple[flowkit.App, Any]:
    app = flowkit.App(name)
    nums = app.topic("nums", value_type=int)
    return app, nums


async def test_retry_then_success_processes_the_record_again() -> None:
    app, nums = numbers_app()
    calls: list[int] = []

    @app.agent(nums, on_error={TimeoutError: flowkit.Retry(attempts=3, backoff=0.01)})
    async def flaky(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            calls.append(n)
            if n == 1 and calls.count(1) < 3:
                raise TimeoutError("try again")

    async with TestDriver(app) as driver:
        for i in range(3):
            await driver.send(nums, i)
        await driver.run_until_idle()
        assert calls == [0, 1, 1, 1, 2]
        assert await driver.dead_letters() == []
        assert driver.worker.metrics.retries.labels("flaky")._value.get() == 2


async def test_retries_exhausted_dead_letter_with_the_attempts(make_driver: DriverFactory) -> None:
    app, nums = numbers_app()

    @app.agent(nums, on_error={ValueError: flowkit.Retry(attempts=3, backoff=0.01)})
    async def always(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            if n == 7:
                raise ValueError("seven")

    async with make_driver(app) as driver:
        for i in (6, 7, 8):
            await driver.send(nums, i)
        await driver.run_until_idle()
        [dead] = await driver.dead_letters()
    headers = dict(dead.headers)
    assert dead.value == b"7" and headers["flowkit.attempts"] == b"3"
    assert headers["flowkit.error.type"] == b"ValueError"


async def test_skip_and_stop_actions() -> None:
    app, nums = numbers_app()
    seen: list[int] = []

    @app.agent(nums, on_error=flowkit.ErrorPolicy({KeyError: "skip"}, default="stop"))
    async def picky(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            if n == 1:
                raise KeyError("skip me")
            if n == 3:
                raise RuntimeError("stop everything")
            seen.append(n)

    async with TestDriver(app) as driver:
        for i in range(5):
            await driver.send(nums, i)
        with pytest.raises(RuntimeError, match="stop everything"):
            await driver.run_until_idle()
        assert await driver.dead_letters() == []
        assert driver.worker.metrics.skipped.labels("picky")._value.get() == 1
    assert seen == [0, 2]


def test_bad_policies_are_definition_errors() -> None:
    with pytest.raises(flowkit.DefinitionError, match="must be 'dead_letter'"):
        flowkit.ErrorPolicy({ValueError: "ignore"})  # type: ignore[dict-item]
    with pytest.raises(flowkit.DefinitionError, match="not an exception type"):
        flowkit.ErrorPolicy({"ValueError": "skip"})  # type: ignore[dict-item]
    with pytest.raises(flowkit.DefinitionError, match="attempts"):
        flowkit.Retry(attempts=0)


def test_retry_backoff_grows_and_is_bounded() -> None:
    retry = flowkit.Retry(backoff=0.1, max_backoff=0.5, jitter=0)
    assert [retry.delay(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.5]
    jittered = flowkit.Retry(backoff=1.0, jitter=0.5)
    assert all(0.5 <= jittered.delay(1) <= 1.5 for _ in range(100))


async def test_an_agent_can_have_its_own_dead_letter_topic() -> None:
    app, nums = numbers_app("own")

    @app.agent(nums, dead_letter="nums-failures")
    async def fails(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            raise ValueError("no")

    async with TestDriver(app) as driver:
        await driver.send(nums, 1)
        await driver.run_until_idle()
        assert len(await driver.messages("nums-failures")) == 1
        assert await driver.dead_letters() == []
    edges = {(e.source, e.target, e.kind) for e in app.graph().edges}
    assert ("agent:fails", "topic:nums-failures", "dead_letters") in edges


class SlowSink:
    """A sink that takes its time: each batch waits ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.items: list[Any] = []
        self.batches = 0
        self.runner_options = {"max_pending": 50, "batch_size": 10}

    async def write_batch(self, items: list[Any]) -> None:
        await asyncio.sleep(self.delay)
        self.batches += 1
        self.items.extend(items)

    async def aclose(self) -> None:
        return None


async def test_a_slow_sink_applies_backpressure_and_memory_stays_flat() -> None:
    app, nums = numbers_app("slow")
    slow = SlowSink(0.0005)

    @app.agent(nums, sink=[slow], per_record=True)
    def payload(n: int) -> bytes:
        return b"x" * 1000  # 1 kB per output: 20,000 outputs would be 20 MB if buffered

    async with TestDriver(app) as driver:
        for i in range(20_000):
            await driver.send(nums, i)
        tracemalloc.start()
        try:
            await driver.run_until_idle(timeout=120)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        runner = next(iter(driver.worker.dispatcher.runners.values()))
    assert len(slow.items) == 20_000
    assert runner.peak_pending <= 50  # the bound held: the agent waited for the sink
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes: outputs were buffered"


async def test_sinks_run_concurrently_and_fail_independently() -> None:
    app, nums = numbers_app("multi")
    slow = SlowSink(0.02)
    fast: list[int] = []
    failing_calls: list[int] = []

    async def failing(n: int) -> None:
        failing_calls.append(n)
        if n == 2:
            raise OSError("disk full")

    failing.runner_options = {}  # type: ignore[attr-defined]

    @app.agent(nums, sink=[slow, fast.append, failing], per_record=True)
    def passthrough(n: int) -> int:
        return n

    async with TestDriver(app) as driver:
        for i in range(5):
            await driver.send(nums, i)
        await driver.run_until_idle()
        dead = await driver.dead_letters()
    assert fast == [0, 1, 2, 3, 4] and slow.items == [0, 1, 2, 3, 4]
    # The failing sink retried item 2 (3 attempts), dead-lettered it, and went on.
    assert failing_calls.count(2) == 3 and failing_calls[-2:] == [3, 4]
    [letter] = dead
    headers = dict(letter.headers)
    assert letter.value == b"2" and headers["flowkit.error.stage"] == b"sink"
    assert headers["flowkit.attempts"] == b"3"


async def test_a_sink_output_is_written_before_its_offset_is_committed() -> None:
    app, nums = numbers_app("order")
    slow = SlowSink(0.05)

    @app.agent(nums, sink=[slow], per_record=True)
    def passthrough(n: int) -> int:
        return n

    driver = TestDriver(app)
    async with driver:
        await driver.send(nums, 1)
        await driver.run_until_idle()
        await driver.worker.checkpoint()
        tp = flowkit.TopicPartition("nums", 0)
        assert driver.broker.committed("order", tp) == 1
        assert slow.items == [1]


async def test_a_failing_batches_list_dead_letters_every_record_in_it() -> None:
    app, nums = numbers_app("chunks")
    written: list[list[int]] = []

    @app.agent(nums)
    async def write(stream: flowkit.Stream[int]) -> None:
        async for chunk in stream.batches(max_size=3, within_seconds=0.01):
            if 4 in chunk:
                raise OSError("database down")
            written.append(chunk)

    async with TestDriver(app) as driver:
        for i in range(9):
            await driver.send(nums, i)
        await driver.run_until_idle()
        dead = await driver.dead_letters()
        await driver.worker.checkpoint()
        committed = driver.broker.committed("chunks", flowkit.TopicPartition("nums", 0))
    assert written == [[0, 1, 2], [6, 7, 8]]
    assert sorted(int(d.value) for d in dead) == [3, 4, 5]  # the whole failed list
    assert committed == 9


@pytest.mark.parametrize("then", ["skip", "stop"])
async def test_a_sink_gives_up_as_its_retry_says(then: str) -> None:
    app, nums = numbers_app(f"then-{then}")

    class Broken:
        def __init__(self) -> None:
            self.runner_options = {"retry": flowkit.Retry(attempts=2, backoff=0.001, then=then)}

        async def write_batch(self, items: list[Any]) -> None:
            raise OSError("no route to host")

        async def aclose(self) -> None:
            return None

    @app.agent(nums, sink=[Broken()], per_record=True)
    def passthrough(n: int) -> int:
        return n

    async with TestDriver(app) as driver:
        await driver.send(nums, 1)
        if then == "stop":
            with pytest.raises(flowkit.SinkError, match="no route to host"):
                await driver.run_until_idle()
                await driver.worker.checkpoint()
        else:
            await driver.run_until_idle()
            assert await driver.dead_letters() == []
            assert driver.worker.metrics.skipped.labels("passthrough")._value.get() == 1
