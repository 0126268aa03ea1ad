"""``WindowedTable.add`` outside an agent's record: in a task (with ``ts=``), or nowhere."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.errors import NotRunningError
from flowkit.records import TopicPartition
from flowkit.scope import TaskScope, enter_scope, leave_scope
from flowkit.state.windowed import wire


def test_add_outside_an_agent_needs_a_worker_and_a_time() -> None:
    app = flowkit.App("adds", partitions=1)
    counts = app.table("counts", default=int).tumbling(10.0)
    with pytest.raises(NotRunningError, match="inside a running worker"):
        counts.add("k", 1, ts=0)
    store = counts.new_store(lambda: 0)
    store.assign([0])
    token = enter_scope(TaskScope(stores={counts: store}, sender=None, now_ms=lambda: 0))
    try:
        with pytest.raises(NotRunningError, match="needs ts="):
            counts.add("k", 1)
        counts.add("k", 2, ts=1_000)
        counts.add("k", 3, ts=2_000)
        counts.add("k", 4, 3_000)  # by position: the same as ts=
        assert counts.value("k", 1_000) == 9
        counts.add("k", 1, 12_000)
        assert counts.value("k", 12_000) == 1
    finally:
        leave_scope(token)


class _Batch:
    """What add() reads of an agent's batch: its partition and the batch's memo."""

    tp = TopicPartition("views", 0)
    memo: Any = None


class _AgentScope(TaskScope):
    batch: Any = None


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.sampled_from("ab"), st.integers(0, 60).map(lambda s: s * 500)),
            st.just("flush"),  # the changelog drain forgets the hot window
            st.just("batch"),  # a new batch: the memo is found again
        ),
        max_size=60,
    )
)
def test_add_counts_every_record_in_its_window_or_as_late(ops: list[Any]) -> None:
    # add()'s shortcuts (the hot window, the batch's memo) against the plain rule: a record
    # moves the watermark to its time minus grace, then counts in its window unless that
    # window has ended by the watermark, in which case it is late.
    late: list[tuple[str, int]] = []
    app = flowkit.App("adds", partitions=1)
    counts = app.table("counts", default=int).tumbling(
        10.0, grace=3.0, late=lambda key, window, n: late.append((key, window.start))
    )
    store = counts.new_store(lambda: 10**9)
    store.assign([0])
    scope = _AgentScope(stores={counts: store}, sender=None, now_ms=lambda: 10**9)
    scope.batch = _Batch()
    want: Counter[tuple[str, int]] = Counter()
    want_late: list[tuple[str, int]] = []
    wm = -(10**9)
    token = enter_scope(scope)
    try:
        for op in ops:
            if op == "flush":
                store.drain_changes()
            elif op == "batch":
                scope.batch = _Batch()
            else:
                key, ts = op
                counts.add(key, 1, ts)
                wm = max(wm, ts - 3_000)
                start = ts - ts % 10_000
                if start + 10_000 <= wm:
                    want_late.append((key, start))
                else:
                    want[key, start] += 1
    finally:
        leave_scope(token)
    got: Counter[tuple[str, int]] = Counter()
    for start, window in store.parts[0].partials.items():
        for key, n in window.items():
            got[key, start] += n
    for _, _, value in store.drain_outbox():
        kind, start, _, key, n = wire.decode(value)
        if kind == "p":
            got[key, start] += n
    assert got == want
    assert late == want_late
