"""Stage 2 of windowed tables: the owner combines partials and closes windows once."""

from __future__ import annotations

import operator
from typing import Any

from flowkit.records import Message
from flowkit.state.windowed import wire
from flowkit.state.windowed.owner import Owners
from flowkit.windows import TumblingWindow


def owners(sources: int = 2, expires: float | None = None) -> Owners:
    o = Owners(TumblingWindow(10, grace=0, expires=expires), sources=sources, combine=operator.add)
    o.assign([0])
    return o


def receive(o: Owners, *values: bytes) -> list[tuple[Any, int, Any]]:
    messages = [Message("r", 0, i, 0, None, v) for i, v in enumerate(values)]
    return [(k, w.start, v) for k, w, v in o.receive(0, messages)]


def test_a_window_closes_when_every_source_has_passed_it() -> None:
    o = owners()
    assert receive(o, wire.partial(0, 0, "a", 2), wire.partial(0, 1, "a", 3)) == []
    assert receive(o, wire.marker(10_000, 0)) == []  # source 1 has not passed the end
    assert receive(o, wire.marker(10_000, 1)) == [("a", 0, 5)]
    assert o.closed_windows == 1
    assert receive(o, wire.marker(20_000, 0), wire.marker(20_000, 1)) == []  # once only


def test_a_replayed_partial_replaces_and_a_late_replay_is_ignored() -> None:
    o = owners(sources=1)
    receive(o, wire.partial(0, 0, "a", 2), wire.partial(0, 0, "a", 2))  # sent twice
    assert receive(o, wire.marker(10_000, 0)) == [("a", 0, 2)]
    assert receive(o, wire.partial(0, 0, "a", 2)) == []  # a replay after the close
    assert o.replays_ignored == 1
    assert o.owners[0].closed == {0: {"a": 2}}


def test_closed_windows_expire() -> None:
    o = owners(sources=1, expires=15)
    receive(o, wire.partial(0, 0, "a", 1), wire.marker(10_000, 0))
    receive(o, wire.marker(24_999, 0))
    assert 0 in o.owners[0].closed
    receive(o, wire.marker(25_000, 0))
    assert o.owners[0].closed == {}


def test_the_changelog_rebuilds_stage_2() -> None:
    o = owners()
    receive(o, wire.partial(0, 0, "a", 2), wire.partial(10_000, 1, "b", 4))
    receive(o, wire.marker(10_000, 0), wire.marker(10_000, 1))
    records: list[tuple[int, bytes, bytes | None]] = []
    o.drain_changes_into(records)
    fresh = owners()
    for _, key, value in records:
        parts = wire.decode(key)
        fresh.apply_record(
            fresh.owners[0], parts[0], parts, None if value is None else wire.decode(value)
        )
    fresh.recovered(fresh.owners[0], 0)
    got, want = fresh.owners[0], o.owners[0]
    assert got.open == want.open == {10_000: {"b": {1: 4}}}
    assert got.closed == want.closed == {0: {"a": 2}}
    assert got.source_wm == want.source_wm == [10_000, 10_000]
