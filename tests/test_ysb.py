"""YSB correctness: the emitted window counts equal a ground truth computed here."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from examples import ysb
from flowkit.testing import FakeClock
from flowkit.windows import WindowResult
from tests.conftest import ALL_CLIENTS, DriverFactory

GRACE_MS = 5_000
WINDOW_MS = 10_000


def data_set(clock: FakeClock, count: int = 12_000, late: int = 25):
    """Events out of order within the grace, then ``late`` events far behind every
    partition's watermark. Returns (events, ground truth {(campaign, start): count})."""
    start_ms = int(clock.time() * 1000) - 3_600_000
    start_ms -= start_ms % WINDOW_MS
    rng = random.Random(3)
    events = []
    for user, event in ysb.generate_events(count, start_ms=start_ms, per_second=250):
        event.event_time -= rng.randint(0, 2_000)  # out of order, well within the grace
        events.append((user, event))
    mapping = ysb.campaign_map()
    truth: Counter[tuple[str, int]] = Counter()
    for _, e in events:
        if e.event_type == "view":
            truth[mapping[e.ad_id], e.event_time - e.event_time % WINDOW_MS] += 1
    late_events = []
    for user, e in list(ysb.generate_events(late, start_ms=start_ms, seed=99)):
        e.event_type = "view"
        late_events.append((user, e))  # 48 s behind: their windows closed long ago
    return events, late_events, truth


async def run_ysb(
    make_driver: DriverFactory, clock: FakeClock, batches: list[list], per_record: bool = False
) -> None:
    """Run the YSB app once per list of events, a fresh app each time (restarts)."""
    for i, events in enumerate(batches):
        app = ysb.make_app(
            generate=False, grace=GRACE_MS / 1000, on_close=None, per_record=per_record
        )
        async with make_driver(app, clock=clock) as driver:
            for user, event in events:
                await driver.send("ysb-events", event, key=user, timestamp_ms=event.event_time)
            await driver.run_until_idle()
            if i == len(batches) - 1:
                # The data ends: once caught up and quiet, partitions close their windows.
                await driver.advance(35)
                await driver.advance(35)


async def results(make_driver: DriverFactory, clock: FakeClock) -> tuple[Counter, list]:
    app = ysb.make_app(generate=False, on_close=None)
    driver = make_driver(app, clock=clock)
    got: Counter[tuple[str, int]] = Counter()
    seen = []
    for value in await driver.values("ysb-window-counts"):
        assert isinstance(value, WindowResult)
        seen.append((value.key, value.start))
        got[value.key, value.start] += value.value
    return got, seen


@pytest.mark.parametrize("restart", [False, True], ids=["one-run", "restart-midway"])
@pytest.mark.parametrize("make_driver", ALL_CLIENTS, indirect=True)
async def test_ysb_counts_equal_ground_truth(restart: bool, make_driver: DriverFactory) -> None:
    await check_ysb(make_driver, restart)


@pytest.mark.parametrize("make_driver", ["memory"], indirect=True)
async def test_ysb_as_a_per_record_agent_counts_the_same(make_driver: DriverFactory) -> None:
    """The query as a plain function called per record (a global table read, a windowed
    add): the same counts, and its late records dead-lettered where they fail."""
    await check_ysb(make_driver, restart=True, per_record=True)


async def check_ysb(make_driver: DriverFactory, restart: bool, per_record: bool = False) -> None:
    clock = FakeClock()
    events, late_events, truth = data_set(clock)
    if restart:
        half = len(events) // 2
        batches = [events[:half], events[half:] + late_events]
    else:
        batches = [events + late_events]
    await run_ysb(make_driver, clock, batches, per_record)
    got, seen = await results(make_driver, clock)
    assert len(seen) == len(set(seen)), "a window was emitted twice"
    assert got == truth
    # Late records are not mixed in: they are in the dead-letter topic, one each.
    app = ysb.make_app(generate=False, on_close=None)
    dead = await make_driver(app, clock=clock).dead_letters()
    assert len(dead) == len(late_events)
    assert {dict(d.headers)["flowkit.error.type"] for d in dead} == {b"LateRecord"}
    assert {dict(d.headers)["flowkit.error.stage"] for d in dead} == {b"window"}


async def test_filtered_records_move_stream_time(make_driver: DriverFactory) -> None:
    """Every partition's last records are clicks, which the agent filters out; with the
    wall-clock ``idle_timeout`` off, those clicks alone close every window (stream time)."""
    await check_clicks_close_windows(make_driver)


@pytest.mark.parametrize("make_driver", ["memory"], indirect=True)
async def test_records_a_per_record_agent_does_not_add_move_stream_time(
    make_driver: DriverFactory,
) -> None:
    """The same, with the query as a per-record agent, which does not add the clicks."""
    await check_clicks_close_windows(make_driver, per_record=True)


async def check_clicks_close_windows(make_driver: DriverFactory, per_record: bool = False) -> None:
    clock = FakeClock()
    events, _, truth = data_set(clock, count=4_000)
    end = max(e.event_time for _, e in events)
    clicks = []
    for i, (_, e) in enumerate(ysb.generate_events(200, start_ms=end, seed=5)):
        e.event_type = "click"
        e.event_time = end + WINDOW_MS + GRACE_MS + i  # past the last window's end + grace
        clicks.append((f"user-{i}", e))  # 200 keys: every partition gets clicks last
    app = ysb.make_app(
        generate=False,
        grace=GRACE_MS / 1000,
        idle_timeout=None,
        on_close=None,
        per_record=per_record,
    )
    async with make_driver(app, clock=clock) as driver:
        for user, event in events + clicks:
            await driver.send("ysb-events", event, key=user, timestamp_ms=event.event_time)
        await driver.run_until_idle()
        await driver.run_until_idle()  # the owners' markers, then the closed windows
        got: Counter[tuple[str, int]] = Counter()
        for value in await driver.values("ysb-window-counts"):
            got[value.key, value.start] += value.value
    assert got == truth
