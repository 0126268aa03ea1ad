"""Assignment: what a worker does when the group moves its partitions."""

from __future__ import annotations

import flowkit
from flowkit.checkpoint import OffsetTracker
from flowkit.errors import CommitFailed
from flowkit.metrics import Metrics
from flowkit.records import TopicPartition
from flowkit.runtime import required_topics
from flowkit.runtime.lifecycle.assignment import Assignment
from flowkit.runtime.tables.keeper import StateKeeper
from flowkit.testing import FakeClock
from flowkit.transports import MemoryTransport


async def test_a_revocation_whose_commit_fails_drops_the_partitions_and_goes_on() -> None:
    app = flowkit.App("moved", partitions=2)
    totals = app.table("totals", default=int)

    async def send(*_: object, **__: object) -> None:
        return None

    transport = MemoryTransport()
    await transport.create_topics(required_topics(app))
    state = StateKeeper(app, transport, FakeClock(), send)
    tracker = OffsetTracker()
    commits: list[set[TopicPartition]] = []

    async def checkpoint(tps: set[TopicPartition]) -> None:
        commits.append(tps)
        raise CommitFailed("commit failed, the group rebalanced")

    assignment = Assignment(
        state=state,
        tracker=tracker,
        checkpoint=checkpoint,
        failed=lambda: False,
        metrics=Metrics(),
        drain_timeout=1.0,
    )
    tps = {TopicPartition("in", 0), TopicPartition("in", 1)}
    await assignment.on_partitions_assigned(tps)
    assert state.stores[totals].held() == {0, 1}
    lost = {TopicPartition("in", 1)}
    await assignment.on_partitions_revoked(lost)  # no exception: the worker goes on
    assert commits == [lost]
    assert assignment.assigned == {TopicPartition("in", 0)}
    assert state.stores[totals].held() == {0}
    assert assignment.rebalancing == 0
