"""``WindowedTable.add`` outside an agent's record: in a task (with ``ts=``), or nowhere."""

from __future__ import annotations

import pytest

import flowkit
from flowkit.errors import NotRunningError
from flowkit.scope import TaskScope, enter_scope, leave_scope


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
