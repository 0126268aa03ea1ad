"""Faust's stream operators: take(n, within=) on the worker's clock, enumerate(), echo()."""

from __future__ import annotations

from datetime import timedelta

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver


def committed(driver: TestDriver, app: flowkit.App, topic: str) -> int | None:
    return driver.broker.committed(app.name, flowkit.TopicPartition(topic, 0))


async def test_take_yields_full_lists_at_once_and_the_rest_when_the_clock_says() -> None:
    app = flowkit.App("take")
    nums = app.topic("nums", value_type=int)
    lists: list[list[int]] = []

    @app.agent(nums)
    async def collect(stream: flowkit.Stream[int]) -> None:
        async for chunk in stream.take(3, within=timedelta(seconds=10)):
            lists.append(chunk)

    clock = FakeClock()
    async with TestDriver(app, clock=clock) as driver:
        for i in range(5):
            await driver.send(nums, i)
        await driver.run_until_idle()  # idle: [3, 4] waits for the clock, not for work
        assert lists == [[0, 1, 2]]
        await driver.worker.checkpoint()
        # 3 and 4 are still the agent's, and they came in one fetched batch with 0-2.
        assert committed(driver, app, "nums") is None
        await driver.advance(9.9)
        assert lists == [[0, 1, 2]]
        await driver.advance(0.1)
        assert lists == [[0, 1, 2], [3, 4]]
        await driver.send(nums, 5)
        await driver.run_until_idle()
        await driver.worker.checkpoint()
        assert committed(driver, app, "nums") == 5  # the next list was asked for
    assert lists == [[0, 1, 2], [3, 4], [5]]  # the stream ended: the last list


async def test_take_without_within_waits_for_full_lists() -> None:
    app = flowkit.App("take-all")
    nums = app.topic("nums", value_type=int)
    lists: list[list[int]] = []

    @app.agent(nums)
    async def collect(stream: flowkit.Stream[int]) -> None:
        async for chunk in stream.filter(lambda n: n % 2 == 0).take(2):
            lists.append(chunk)

    async with TestDriver(app, clock=FakeClock()) as driver:
        for i in range(9):
            await driver.send(nums, i)
        await driver.run_until_idle()
        await driver.advance(120)  # no within: [8] waits for a second value, however long
        assert lists == [[0, 2], [4, 6]]
    assert lists == [[0, 2], [4, 6], [8]]  # the stream ended: the last list as it is


async def test_enumerate_numbers_the_values_that_reach_it() -> None:
    app = flowkit.App("enum")
    words = app.topic("words", value_type=str)
    seen: list[tuple[int, str]] = []

    @app.agent(words)
    async def number(stream: flowkit.Stream[str]) -> None:
        async for i, word in stream.filter(lambda w: w != "skip").enumerate(1):
            seen.append((i, word))

    async with TestDriver(app, clock=FakeClock()) as driver:
        for word in ("a", "skip", "b", "c"):
            await driver.send(words, word)
        await driver.run_until_idle()
    assert seen == [(1, "a"), (2, "b"), (3, "c")]


async def test_echo_sends_each_value_with_its_key_before_the_agent_gets_it() -> None:
    app = flowkit.App("echo")
    orders = app.topic("orders", value_type=int)
    audit = app.topic("audit", value_type=int)
    copies = app.topic("copies", value_type=str)
    seen: list[int] = []

    @app.agent(orders)
    async def handle(stream: flowkit.Stream[int]) -> None:
        async for amount in stream.filter(lambda a: a > 10).echo(audit).map(str).echo(copies):
            seen.append(int(amount))

    async with TestDriver(app, clock=FakeClock()) as driver:
        for amount in (5, 20, 30):
            await driver.send(orders, amount, key=f"k{amount}")
        await driver.run_until_idle()
        await driver.worker.checkpoint()
        echoed = await driver.messages(audit)
        assert [(m.key, m.value) for m in echoed] == [(b"k20", b"20"), (b"k30", b"30")]
        assert await driver.values(copies) == ["20", "30"]
        assert committed(driver, app, "orders") == 3
    assert seen == [20, 30]


def test_echo_needs_topics_and_cannot_come_before_lists() -> None:
    app = flowkit.App("echo-bad")
    nums = app.topic("nums", value_type=int)
    from flowkit.streams import StreamSource

    stream: flowkit.Stream[int] = flowkit.Stream(StreamSource("s"))
    with pytest.raises(flowkit.DefinitionError, match="one or more topics"):
        stream.echo()
    with pytest.raises(flowkit.DefinitionError, match=r"echo\(\) cannot come before take\(\)"):
        stream.echo(nums).take(2)
    with pytest.raises(flowkit.DefinitionError, match=r"take\(\): within must be seconds"):
        stream.take(2, within="1s")  # type: ignore[arg-type]
