"""The Worker: one App run by several workers, each with its own state; the app id."""

from __future__ import annotations

from typing import Any

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver

# A module-level app, as docs/getting-started.md shows: every test below shares it.


class Click(flowkit.Record):
    campaign: str
    t: int


closed: list[tuple[str, int, int]] = []
app = flowkit.App("shared", partitions=2)
clicks = app.topic("clicks", value_type=Click)
totals = app.table("totals", default=int)
counts = app.table("counts", default=int).tumbling(
    10.0, grace=0.0, time=lambda c: c.t, on_close=lambda k, w, v: closed.append((k, w.start, v))
)


@app.agent(clicks)
async def count(stream: flowkit.Stream[Click]) -> None:
    async for click in stream:
        counts[click.campaign] += 1


@app.agent(clicks.group_by(lambda c: c.campaign, name="by-campaign"))
async def total(stream: flowkit.Stream[Click]) -> None:
    async for click in stream:
        totals[click.campaign] += 1


async def feed(driver: TestDriver, t0: int, n: int) -> None:
    for i in range(n):
        await driver.send(clicks, Click("c", t0 + i * 1000), partition=i % 2)
    await driver.run_until_idle()


@pytest.mark.parametrize("run", [1, 2])
async def test_a_module_level_app_gives_each_test_fresh_state(run: int) -> None:
    """Run twice: the second run sees none of the first one's counts or windows."""
    clock = FakeClock()
    t0 = 1_000_000_000_000
    async with TestDriver(app, clock=clock) as driver:
        await feed(driver, t0, 12)  # window [t0, t0+10 s) closes at the 11th click
        assert totals["c"] == 12
        assert counts.windows("c")[flowkit.Window(t0, t0 + 10_000)] == 10
        assert counts.late_records == 0
        assert await driver.dead_letters() == []


async def test_two_workers_run_one_app_at_once_independently() -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    t0 = 1_000_000_000_000
    async with TestDriver(app, clock=clock_a) as a, TestDriver(app, clock=clock_b) as b:
        await feed(a, t0, 5)
        await feed(b, t0 + 50_000, 12)
        await feed(a, t0 + 5_000, 3)
        assert a.store(totals)["c"] == 8 and b.store(totals)["c"] == 12
        assert dict(a.store(counts).windows("c")) == {flowkit.Window(t0, t0 + 10_000): 8}
        assert b.store(counts).windows("c")[flowkit.Window(t0 + 50_000, t0 + 60_000)] == 10
        # b's watermark is 50 s ahead of a's: a's records are not late for a.
        assert a.store(counts).late_records == 0 and not await a.dead_letters()
        assert totals["c"] == 12  # the test task reads the driver it entered last


async def test_outside_a_worker_tables_and_topics_say_so() -> None:
    fresh = flowkit.App("fresh")
    table = fresh.table("t", default=int)
    topic = fresh.topic("x", value_type=int)
    with pytest.raises(flowkit.NotRunningError, match="inside a running worker"):
        table["k"]
    with pytest.raises(flowkit.NotRunningError, match="inside a running worker"):
        await topic.send(1)


def test_a_group_id_other_than_the_app_name_is_refused() -> None:
    with pytest.raises(flowkit.ConfigurationError, match="application id"):
        flowkit.Worker(flowkit.App("ysb"), group_id="ysb-2")
    worker = flowkit.Worker(flowkit.App("ysb"), group_id="ysb")
    assert worker.group_id == "ysb"


async def test_a_task_that_raises_stops_the_worker_with_one_line() -> None:
    failing = flowkit.App("tasks")

    @failing.task
    async def boom() -> None:
        raise ValueError("no config")

    driver = TestDriver(failing)
    with pytest.raises(flowkit.TaskFailed, match=r"task 'boom' failed: ValueError\('no config'\)"):
        async with driver:
            await driver.run_until_idle()
    assert isinstance(driver.worker.error, flowkit.TaskFailed)


@pytest.mark.parametrize("policy", ["restart", "ignore"])
async def test_a_task_may_restart_or_be_ignored(policy: str) -> None:
    tasks = flowkit.App("tasks")
    calls: list[int] = []

    @tasks.task(on_error=policy)
    async def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("not yet")

    clock = FakeClock()
    async with TestDriver(tasks, clock=clock) as driver:
        await driver.advance(10)  # backoff 1 s, then 2 s
        assert driver.worker.error is None
    assert len(calls) == (3 if policy == "restart" else 1)


async def test_a_timer_that_raises_stops_the_worker_unless_told_otherwise() -> None:
    timers = flowkit.App("timers")
    ticks: list[str] = []

    @timers.timer(1.0, on_error="ignore")
    async def tolerant() -> None:
        ticks.append("tolerant")
        raise ValueError("ignored")

    @timers.timer(2.5)
    async def strict() -> None:
        raise ValueError("stop")

    driver = TestDriver(timers, clock=FakeClock())
    with pytest.raises(flowkit.TaskFailed, match="timer 'strict' failed"):
        async with driver:
            await driver.advance(3)
    assert len(ticks) >= 2  # the tolerant timer fired again after its errors


def test_task_policies_are_checked_at_declaration() -> None:
    bad = flowkit.App("bad")
    with pytest.raises(flowkit.DefinitionError, match="on_error must be"):

        @bad.task(on_error="retry")
        async def t() -> Any:
            return None
