"""Failures dealt with where they happen: per-record generators, and records that do not
decode, without the agent being started again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import flowkit
from flowkit.errors import DefinitionError
from tests.conftest import DriverFactory


async def test_a_per_record_generator_yields_several_outputs_and_its_failures_are_dead_letters(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("gen")
    nums = app.topic("nums", value_type=int, partitions=1)
    small = app.topic("small", value_type=int)
    big = app.topic("big", value_type=int)
    calls: list[int] = []

    @app.agent(nums, sink=[small, big], per_record=True)
    def split(n: int) -> Iterator[flowkit.Output]:
        calls.append(n)
        yield flowkit.Output(n, to=small)
        if n == 3:
            raise ValueError("three is bad")  # after its first output: that one is sent
        yield flowkit.Output(n * 10, to=(big,))

    assert split.output_type() is flowkit.Output
    async with make_driver(app) as driver:
        for i in range(5):
            await driver.send(nums, i, key="k")
        await driver.run_until_idle()
        assert await driver.values(small) == [0, 1, 2, 3, 4]
        assert await driver.values(big) == [0, 10, 20, 40]
        [dead] = await driver.dead_letters()
        headers = dict(dead.headers)
        assert dead.value == b"3" and headers["flowkit.error.type"] == b"ValueError"
        assert headers["flowkit.source.offset"] == b"3"
        assert b"three is bad" in headers["flowkit.error.traceback"]
        assert calls == [0, 1, 2, 3, 4]  # each record once: no retry, no replay
        assert driver.worker.metrics.errors.labels("split", "process")._value.get() == 1
        assert driver.worker.dispatcher.outputs == {"split": 9}


async def test_a_per_record_agent_still_retries_and_skips_by_its_policy(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("retry")
    nums = app.topic("nums", value_type=int, partitions=1)
    out = app.topic("out", value_type=int)
    attempts: dict[int, int] = {}

    @app.agent(
        nums,
        sink=[out],
        per_record=True,
        on_error={
            TimeoutError: flowkit.Retry(attempts=3, backoff=0.001),
            KeyError: "skip",
        },
    )
    def flaky(n: int) -> int:
        attempts[n] = attempts.get(n, 0) + 1
        if n == 1 and attempts[n] < 3:
            raise TimeoutError("not yet")
        if n == 2:
            raise KeyError("skipped")
        return n

    async with make_driver(app) as driver:
        for i in range(4):
            await driver.send(nums, i)
        await driver.run_until_idle()
        assert await driver.values(out) == [0, 1, 3]
        assert attempts == {0: 1, 1: 3, 2: 1, 3: 1}
        assert await driver.dead_letters() == []
        assert driver.worker.metrics.skipped.labels("flaky")._value.get() == 1


async def test_a_record_that_does_not_decode_does_not_restart_a_stream_agent(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("keep")
    nums = app.topic("nums", value_type=int, partitions=1)
    out = app.topic("out", value_type=int)

    @app.agent(nums, sink=[out])
    async def running_total(stream: flowkit.Stream[int]) -> AsyncIterator[int]:
        total = 0  # local state: lost if the agent were started again
        async for n in stream:
            total += n
            yield total

    async with make_driver(app) as driver:
        await driver.send(nums, 1)
        await driver.send_raw(nums, b"not a number")
        await driver.send(nums, 2)
        await driver.send_raw(nums, b"[")
        await driver.send(nums, 3)
        await driver.run_until_idle()
        assert await driver.values(out) == [1, 3, 6]
        dead = await driver.dead_letters()
        assert [d.value for d in dead] == [b"not a number", b"["]
        assert {dict(d.headers)["flowkit.error.stage"] for d in dead} == {b"decode"}


async def test_fail_fast_raises_from_a_per_record_generator(make_driver: DriverFactory) -> None:
    app = flowkit.App("ff")
    nums = app.topic("nums", value_type=int)

    @app.agent(nums, per_record=True)
    def boom(n: int) -> Iterator[int]:
        yield n
        raise KeyError("nope")

    async with make_driver(app, fail_fast=True) as driver:
        await driver.send(nums, 1)
        with pytest.raises(KeyError):
            await driver.run_until_idle()


def test_a_per_record_agent_cannot_be_an_async_generator() -> None:
    app = flowkit.App("bad")
    nums = app.topic("nums", value_type=int)

    async def gen(n: int) -> AsyncIterator[int]:
        yield n

    with pytest.raises(DefinitionError, match="cannot be an async generator"):
        app.agent(nums, per_record=True)(gen)
