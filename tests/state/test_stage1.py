"""Stage 1 of windowed tables: partials per source partition, watermarks, the outbox."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from flowkit.errors import FutureRecord
from flowkit.state.windowed import wire
from flowkit.state.windowed.owner import Owners
from flowkit.state.windowed.stage1 import NONE, Stage1
from flowkit.windows import TumblingWindow

OWNER_OF = {"a": 0, "b": 1}


def stage(grace: float = 0.0, now_ms: int = 10**13) -> Stage1:
    s = Stage1(
        TumblingWindow(10, grace=grace),
        partitions=2,
        partition_of=OWNER_OF.__getitem__,
        encode_key=str.encode,
        now_ms=lambda: now_ms,
        name="counts",
    )
    s.assign([0, 1])
    return s


def add(s: Stage1, p: int, key: str, ts: int, n: int = 1) -> None:
    """What WindowedTable.add does for one record of partition ``p``."""
    part = s.parts[p]
    if ts > part.max_ts:
        s.advance(part, ts)
    start = ts - ts % 10_000
    assert not s.is_closed(part, start)
    window = s.window_for_add(part, start, key, n)
    window[key] = window.get(key, 0) + n


def outbox(s: Stage1) -> list[tuple[int, Any]]:
    return [(q, wire.decode(v)) for q, _, v in s.drain_outbox()]


def test_a_window_ships_its_partials_to_the_owners_when_the_watermark_passes() -> None:
    s = stage()
    add(s, 0, "a", 1_000)
    add(s, 0, "b", 2_000, 2)
    add(s, 0, "a", 9_999)
    assert outbox(s) == [(0, ["w", 9_999, 0, None, None]), (1, ["w", 9_999, 0, None, None])]
    add(s, 0, "a", 10_000)  # the watermark reaches the end: the window closes
    assert s.parts[0].partials == {10_000: {"a": 1}}
    assert s.is_closed(s.parts[0], 0)
    shipped = outbox(s)
    assert (0, ["p", 0, 0, "a", 2]) in shipped and (1, ["p", 0, 0, "b", 2]) in shipped
    # The marker follows the partials: an owner never closes a window without them.
    assert shipped[-2:] == [(0, ["w", 10_000, 0, None, None]), (1, ["w", 10_000, 0, None, None])]


def test_markers_go_once_per_window_boundary() -> None:
    s = stage()
    add(s, 1, "a", 1_000)
    assert len(outbox(s)) == 2
    add(s, 1, "a", 5_000)
    assert not s.has_outbox() and outbox(s) == []  # same window: nothing new to close
    add(s, 1, "a", 12_000)
    assert s.has_outbox()


def test_what_was_not_sent_goes_back_first_in_line() -> None:
    s = stage()
    add(s, 0, "a", 1_000)
    items = s.drain_outbox()
    s.requeue_outbox(items[1:])
    add(s, 0, "a", 15_000)
    again = s.drain_outbox()
    assert again[0] == items[1]


def test_an_idle_caught_up_partition_moves_to_the_wall_clock() -> None:
    s = stage(now_ms=1_000_000)
    add(s, 0, "a", 1_000)
    s.tick(100.0, {0}, idle_timeout=30)  # caught up: quiet since now
    s.tick(120.0, {0}, idle_timeout=30)
    assert s.parts[0].wm == 1_000
    s.tick(131.0, {0}, idle_timeout=30)
    assert s.parts[0].wm == 1_000_000 and s.parts[0].partials == {}
    s.tick(200.0, set(), idle_timeout=30)  # behind: no longer quiet
    assert s.parts[0].active == -1.0


def test_an_event_time_far_in_the_future_is_refused() -> None:
    s = stage(now_ms=1_000_000)
    with pytest.raises(FutureRecord) as info:
        s.advance(s.parts[0], 1_000_000 + 3_600_001)
    assert str(info.value).startswith(
        "event time 1970-01-01 01:16:40.001 UTC (4600001 ms) is more than max_future=3600 s"
        " ahead of the wall clock"
    )
    assert s.parts[0].wm == NONE


def test_the_changelog_rebuilds_stage_1() -> None:
    s = stage(grace=5.0)
    add(s, 0, "a", 1_000)
    add(s, 0, "b", 12_000)
    add(s, 0, "a", 16_000)  # window 0 closes (watermark 11 s)
    records: list[tuple[int, bytes, bytes | None]] = []
    s.drain_changes_into(records)
    fresh = stage(grace=5.0)
    for p, key, value in records:
        parts = wire.decode(key)
        v = None if value is None else wire.decode(value)
        fresh.apply_record(fresh.parts[p], parts[0], parts, v)
    fresh.recovered(fresh.parts[0])
    got, want = fresh.parts[0], s.parts[0]
    assert got.partials == want.partials == {10_000: {"b": 1, "a": 1}}
    assert (got.wm, got.max_ts, got.sent_wm) == (want.wm, want.max_ts, want.sent_wm)
    assert got.next_end == 20_000


def test_a_shipped_window_is_deleted_from_the_changelog() -> None:
    s = stage()
    add(s, 0, "a", 1_000)
    records: list[tuple[int, bytes, bytes | None]] = []
    s.drain_changes_into(records)
    add(s, 0, "a", 10_000)
    records = []
    s.drain_changes_into(records)
    assert (0, wire.partial_key(0, "a"), None) in records


def test_owners_and_stage1_agree_on_the_wire_format() -> None:
    s = stage()
    owners = Owners(s.spec, sources=2, combine=operator.add)
    owners.assign([0, 1])
    add(s, 0, "a", 1_000)
    add(s, 1, "a", 2_000)
    add(s, 0, "a", 10_500)
    add(s, 1, "b", 11_000)
    from flowkit.records import Message

    closed = []
    for q, key, value in s.drain_outbox():
        closed += owners.receive(q, [Message("r", q, 0, 0, key, value)])
    assert [(k, w.start, v) for k, w, v in closed] == [("a", 0, 2)]
