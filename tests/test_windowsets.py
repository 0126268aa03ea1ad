"""Windowed reads as Faust has them: table[key].current(), .now(), .delta(), .value()."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver

# The same suite on each store of windowed tables (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("window_store")


class Click(flowkit.Record):
    page: str
    t: int


def base_ms(clock: FakeClock) -> int:
    t = int(clock.time() * 1000) - 600_000
    return t - t % 10_000


def reads_app(reads: list[Any], *, partitions: int = 1) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("reads", partitions=partitions)
    clicks = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).tumbling(
        10.0, grace=timedelta(seconds=30), time=lambda c: c.t
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts[click.page] += 1
            views = counts[click.page]
            reads.append((views.current(), views.delta(10), views.value(click.t + 10_000)))

    return app, clicks, counts


async def test_current_delta_and_value_read_the_records_window() -> None:
    clock = FakeClock()
    reads: list[Any] = []
    app, clicks, counts = reads_app(reads)
    t0 = base_ms(clock)
    async with TestDriver(app, clock=clock) as driver:
        for s in (1, 2, 3, 11, 12):
            await driver.send(clicks, Click("/", t0 + s * 1000))
        await driver.run_until_idle()
        # Outside an agent there is no record: explicit times and the wall clock work.
        assert counts["/"].value(t0) == 3
        at = datetime.fromtimestamp((t0 + 11_000) / 1000, tz=UTC)
        assert counts["/"].value(at) == 2
        assert counts["/"].now() == 0  # the wall clock's window has no clicks: default
        assert counts["/"].windows() == {
            flowkit.Window(t0, t0 + 10_000): 3,
            flowkit.Window(t0 + 10_000, t0 + 20_000): 2,
        }
        with pytest.raises(flowkit.NotRunningError, match=r"now\(\) or table\[key\]\.value"):
            counts["/"].current()
    # (current, 10 s before, 10 s after) at each record
    assert reads == [(1, 0, 0), (2, 0, 0), (3, 0, 0), (1, 3, 0), (2, 3, 0)]


async def test_now_follows_the_worker_clock_in_a_timer() -> None:
    clock = FakeClock()
    seen: list[int | None] = []
    app = flowkit.App("now")
    clicks = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).tumbling(60.0, time=lambda c: c.t)

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts[click.page] += 1

    @app.timer(1.0)
    async def report() -> None:
        seen.append(counts["/"].now())

    async with TestDriver(app, clock=clock) as driver:
        now_ms = int(clock.time() * 1000)
        for _ in range(4):
            await driver.send(clicks, Click("/", now_ms))
        await driver.run_until_idle()
        await driver.advance(1)
    assert seen == [4]


async def test_reads_see_the_combined_value_of_every_partition_this_worker_holds() -> None:
    """Two source partitions, one worker: each read combines both partitions' partials."""
    clock = FakeClock()
    reads: list[Any] = []
    app, clicks, counts = reads_app(reads, partitions=2)
    t0 = base_ms(clock)
    async with TestDriver(app, clock=clock) as driver:
        for i in range(6):
            await driver.send(clicks, Click("/", t0 + i * 1000), partition=i % 2)
            await driver.run_until_idle()
        await driver.send(clicks, Click("/", t0 + 45_000), partition=0)  # closes [t0, +10 s)
        await driver.send(clicks, Click("/", t0 + 45_000), partition=1)
        await driver.run_until_idle()
        assert counts["/"].value(t0) == 6  # final, combined on the owner
    assert [current for current, _, _ in reads] == [1, 2, 3, 4, 5, 6, 1, 2]


async def test_plus_equals_adds_to_every_hopping_window() -> None:
    clock = FakeClock()
    app = flowkit.App("hop-reads")
    clicks = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).hopping(10.0, 5.0, time=lambda c: c.t)

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts[click.page] += 2
            counts[click.page] -= 1

    t0 = base_ms(clock)
    async with TestDriver(app, clock=clock) as driver:
        await driver.send(clicks, Click("/", t0 + 7_000))
        await driver.run_until_idle()
        assert counts["/"].windows() == {
            flowkit.Window(t0, t0 + 10_000): 1,
            flowkit.Window(t0 + 5_000, t0 + 15_000): 1,
        }


async def test_plus_equals_on_a_max_table_says_to_use_add() -> None:
    clock = FakeClock()
    app = flowkit.App("max")
    clicks = app.topic("clicks", value_type=Click)
    slowest = app.table("slowest", default=int).tumbling(10.0, combine=max, time=lambda c: c.t)

    @app.agent(clicks)
    async def track(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            slowest[click.page] += 5

    async with TestDriver(app, clock=clock, fail_fast=True) as driver:
        await driver.send(clicks, Click("/", base_ms(clock)))
        with pytest.raises(flowkit.DefinitionError, match=r"combines with max, not \+"):
            await driver.run_until_idle()


def test_table_key_assignment_of_another_windowset_is_refused() -> None:
    app = flowkit.App("copy")
    counts = app.table("counts", default=int).tumbling(10.0)
    with pytest.raises(flowkit.DefinitionError, match=r"table\[b\]\.current\(\)"):
        counts["a"] = counts["b"]
    assert repr(counts["a"]) == "<WindowSet counts['a']>"


async def test_what_a_reader_on_each_of_two_workers_sees() -> None:
    """Open windows: each worker sees its own partitions' part (plus what reached it as
    owner). Closed windows: the owner has the final value; the other worker has nothing."""
    from flowkit.transports import MemoryBroker

    broker = MemoryBroker()
    app, clicks, counts = reads_app([], partitions=2)  # one app, run by two workers
    t0 = base_ms(FakeClock())
    async with (
        TestDriver(app, broker=broker, clock=FakeClock()) as a,
        TestDriver(app, broker=broker, clock=FakeClock()) as b,
    ):

        async def settle() -> None:
            for _ in range(3):
                await a.run_until_idle()
                await b.run_until_idle()

        await settle()
        holder = {
            tp.partition: d
            for d in (a, b)
            for tp in d.worker.fetcher.consumer.assignment()  # type: ignore[union-attr]
            if tp.topic == "clicks"
        }
        assert set(holder) == {0, 1} and holder[0] is not holder[1]

        def read(p: int) -> int | None:  # what counts["/"].value(t0) returns on p's worker
            found: int | None = (
                holder[p].store(counts).windows("/").get(flowkit.Window(t0, t0 + 10_000))
            )
            return found

        for p, n in ((0, 3), (1, 2)):  # 3 clicks on partition 0, 2 on partition 1
            for i in range(n):
                await a.send(clicks, Click("/", t0 + i * 1000), partition=p)
        await settle()
        assert (read(0), read(1)) == (3, 2)  # open: each worker its own part
        for p in (0, 1):  # a later record on both partitions closes the first window
            await a.send(clicks, Click("/", t0 + 45_000), partition=p)
        await settle()
        owner = counts.partition_of("/")
        assert read(owner) == 5  # closed: the final value, on the owner only
        assert read(1 - owner) is None
