"""Every seconds parameter also takes a datetime.timedelta; a wrong type is one line."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver


def test_windows_take_timedeltas() -> None:
    app = flowkit.App("durations")
    counts = app.table("counts", default=int).tumbling(
        timedelta(minutes=1),
        grace=timedelta(seconds=5),
        expires=timedelta(hours=1),
        max_future=timedelta(minutes=10),
        idle_timeout=timedelta(seconds=3),
    )
    spec = counts.spec
    assert (spec.size_ms, spec.grace_ms, spec.expires_ms, spec.max_future_ms) == (
        60_000,
        5_000,
        3_600_000,
        600_000,
    )
    assert counts.idle_timeout == 3.0
    hop = app.table("hop").hopping(timedelta(seconds=10), timedelta(seconds=5))
    assert (hop.spec.size_ms, hop.spec.step_ms) == (10_000, 5_000)
    assert flowkit.App("x", commit_interval=timedelta(milliseconds=500)).commit_interval == 0.5
    retry = flowkit.Retry(backoff=timedelta(milliseconds=200), max_backoff=timedelta(seconds=2))
    assert (retry.backoff, retry.max_backoff) == (0.2, 2.0)


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda app: app.table("t").tumbling("10s"), "window size must be seconds"),
        (lambda app: app.table("t").tumbling(10, grace="5"), "window grace must be seconds"),
        (lambda app: app.table("t").tumbling(10, expires=[1]), "window expires must be"),
        (lambda app: app.table("t").tumbling(10, idle_timeout="x"), "'t': idle_timeout must"),
        (lambda app: app.timer(True)(_tick), "timer '_tick': interval must be seconds"),
        (lambda app: flowkit.App("y", commit_interval="1"), "commit_interval must be seconds"),
        (lambda app: flowkit.Worker(app, shutdown_timeout="1"), "shutdown_timeout must be"),
        (lambda app: flowkit.Worker(app, stall_timeout="1"), "stall_timeout must be seconds"),
        (lambda app: flowkit.Retry(max_backoff="1"), r"Retry\(max_backoff=\) must be seconds"),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_parameter(declare: Any, message: str) -> None:
    with pytest.raises(flowkit.DefinitionError, match=message) as info:
        declare(flowkit.App("durations"))
    assert "\n" not in str(info.value)
    assert "timedelta" in str(info.value)


async def _tick() -> None:
    pass


async def test_timers_and_the_test_clock_take_timedeltas() -> None:
    app = flowkit.App("ticks")
    ticks: list[float] = []
    clock = FakeClock()

    @app.timer(timedelta(seconds=2))
    async def tick() -> None:
        ticks.append(clock.monotonic())

    async with TestDriver(app, clock=clock, shutdown_timeout=timedelta(seconds=5)) as driver:
        await driver.advance(timedelta(seconds=7))
        await driver.run_until_idle(timeout=timedelta(seconds=10))
    assert ticks == [2.0, 4.0, 6.0]
