"""@app.crontab: cron schedules in a time zone on the worker's clock; on_leader=True."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

import flowkit
from flowkit.rendering import render
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker

START = datetime(2026, 3, 28, 23, 40, tzinfo=UTC).timestamp()  # DST starts in Paris at 01:00 UTC


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M")


async def test_crontab_fires_at_the_times_its_schedule_names_in_its_time_zone() -> None:
    # Commits every hour: each 1 s commit tick of two days of fake time would cost a wake.
    app = flowkit.App("cron", commit_interval=timedelta(hours=1))
    clock = FakeClock(START)
    hourly: list[str] = []
    paris: list[str] = []
    india: list[str] = []

    @app.crontab("0 * * * *")
    async def every_hour() -> None:
        hourly.append(utc(clock.time()))

    @app.crontab("30 2 * * *", timezone="Europe/Paris")
    async def half_past_two_in_paris() -> None:
        paris.append(utc(clock.time()))

    @app.crontab("0 9 * * *", timezone=timezone(timedelta(hours=5, minutes=30)))
    async def nine_in_india() -> None:
        india.append(utc(clock.time()))

    async with TestDriver(app, clock=clock) as driver:
        await driver.advance(timedelta(days=2))
    assert hourly[:3] == ["03-29 00:00", "03-29 01:00", "03-29 02:00"]
    assert len(hourly) == 48
    # 02:30 does not exist in Paris on 29 March: at 01:00 UTC, 02:00 local jumps to 03:00.
    # The skipped time fires at the jump (croniter's rule), once.
    assert paris == ["03-29 01:00", "03-30 00:30"]
    assert india == ["03-29 03:30", "03-30 03:30"]


def test_a_time_that_happens_twice_in_autumn_fires_twice() -> None:
    from flowkit.cron import Cron

    cron, t = Cron("30 2 * * *", "Europe/Paris"), datetime(2026, 10, 24, 12, tzinfo=UTC)
    times = []
    ts = t.timestamp()
    for _ in range(3):
        ts = cron.next_after(ts)
        times.append(utc(ts))
    assert times == ["10-25 00:30", "10-25 01:30", "10-26 01:30"]  # CEST, then CET


def on_leader_app(calls: list[str], name: str) -> tuple[flowkit.App, flowkit.Topic[int]]:
    app = flowkit.App("leaders", partitions=2)
    jobs = app.topic("jobs", value_type=int)

    @app.agent(jobs)
    async def work(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            pass

    @app.crontab("*/10 * * * *", on_leader=True)
    async def report() -> None:
        calls.append(f"leader {name}")

    @app.crontab("*/10 * * * *")
    async def everywhere() -> None:
        calls.append(f"every {name}")

    return app, jobs


async def test_on_leader_runs_on_the_one_worker_holding_the_first_partition() -> None:
    broker = MemoryBroker()
    calls: list[str] = []
    clocks = [FakeClock(START), FakeClock(START)]
    app_a, jobs = on_leader_app(calls, "a")
    app_b, _ = on_leader_app(calls, "b")
    async with (
        TestDriver(app_a, broker=broker, clock=clocks[0]) as a,
        TestDriver(app_b, broker=broker, clock=clocks[1]) as b,
    ):
        for _ in range(3):
            await a.send(jobs, 1, partition=0)
            await a.send(jobs, 1, partition=1)
            await a.run_until_idle()
            await b.run_until_idle()
        holders = [d.worker.fetcher.consumer.assignment() for d in (a, b)]  # type: ignore[union-attr]
        assert [len(h) for h in holders] == [1, 1]  # the group split the partitions
        leader = "a" if flowkit.TopicPartition("jobs", 0) in holders[0] else "b"
        await a.advance(600)
        await b.advance(600)
    assert sorted(calls) == sorted(["every a", "every b", f"leader {leader}"])


@pytest.mark.parametrize(
    ("expression", "zone", "message"),
    [
        ("0 * * *", None, "crontab '0 \\* \\* \\*' is not a cron expression"),
        ("0 * * * *", "Mars/Olympus", "crontab timezone 'Mars/Olympus' is not a known"),
        ("0 * * * *", 5, "crontab timezone must be a tzinfo or a name"),
    ],
)
def test_a_bad_schedule_is_one_line(expression: str, zone: object, message: str) -> None:
    app = flowkit.App("bad-cron")
    with pytest.raises(flowkit.DefinitionError, match=message) as info:
        app.crontab(expression, timezone=zone)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_the_graph_shows_the_schedule() -> None:
    app = flowkit.App("cron-graph")

    @app.crontab("0 9 * * 1-5", timezone="Europe/Paris", on_leader=True)
    async def weekday_report() -> None:
        pass

    [node] = [n for n in app.graph().to_dict()["nodes"] if n["kind"] == "timer"]
    assert node["crontab"] == "0 9 * * 1-5 Europe/Paris" and node["on_leader"] is True
    text = render(app.graph(), "text")
    assert "cron 0 9 * * 1-5 Europe/Paris" in text and "on the leader" in text
