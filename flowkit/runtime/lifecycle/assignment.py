"""The partitions a worker holds, and what happens when the group moves them.

The consumer calls ``on_partitions_assigned`` and ``on_partitions_revoked`` from inside
``getmany``. On assignment, table partitions are recovered from their changelogs before
any record of them is processed. On revocation, what was dispatched for the partitions is
finished and committed while this worker still owns them, so the next owner starts
exactly where this one stopped; then their table state is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from ...checkpoint import OffsetTracker
from ...errors import CommitFailed
from ...metrics import Metrics
from ...records import TopicPartition
from ..tables.keeper import StateKeeper

__all__ = ["Assignment"]

log = structlog.get_logger(__name__)


class Assignment:
    """A worker's partitions; the consumer's rebalance listener."""

    def __init__(
        self,
        *,
        state: StateKeeper,
        tracker: OffsetTracker,
        checkpoint: Callable[[set[TopicPartition]], Awaitable[None]],
        failed: Callable[[], bool],
        metrics: Metrics,
        drain_timeout: float,
        forget: Callable[[set[TopicPartition]], None] = lambda tps: None,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._forget = forget  # per-partition metric state of revoked partitions
        self._changed = changed  # told as a rebalance starts and ends (readiness)
        self.state = state
        self.tracker = tracker
        self._checkpoint = checkpoint
        self._failed = failed
        self.metrics = metrics
        self.drain_timeout = drain_timeout
        self.assigned: set[TopicPartition] = set()
        self.joined = False  # the group gave this worker its first assignment
        self.rebalancing = 0  # listener calls under way
        self.assignments = 0  # assignments received so far

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assigned |= assigned
        self.joined = True
        self.assignments += 1
        self.metrics.assigned_partitions.set(len(self.assigned))
        log.info("partitions assigned", partitions=_show(assigned))
        # Tables first: no record of a partition is processed before its state is back.
        self.rebalancing += 1
        self._changed()
        started = time.monotonic()
        try:
            await self.state.recover({tp.partition for tp in assigned})
        finally:
            self.rebalancing -= 1
            self._changed()
            self._observe("assign", started)

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.rebalancing += 1
        self._changed()
        started = time.monotonic()
        try:
            await self._revoke(revoked)
        finally:
            self.rebalancing -= 1
            self._changed()
            self._observe("revoke", started)

    def _observe(self, kind: str, started: float) -> None:
        self.metrics.rebalances.labels(kind).inc()
        self.metrics.rebalance_seconds.labels(kind).observe(time.monotonic() - started)

    async def _revoke(self, revoked: set[TopicPartition]) -> None:
        log.info("partitions revoked", partitions=_show(revoked))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        while self.tracker.in_flight(revoked) and loop.time() < deadline:
            if self._failed():
                break
            await asyncio.sleep(0.005)
        if not self._failed():
            try:
                await self._checkpoint(revoked)
            except CommitFailed as exc:
                # The group moved on without us (a member that stalled past its session):
                # the partitions are another member's now, and it starts at our last
                # commit, so their records since then are processed again (at-least-once).
                # Not a reason to stop: this worker rejoins and gets partitions back.
                log.warning(
                    "could not commit revoked partitions; their newest records will be "
                    "processed again by the next owner",
                    partitions=_show(revoked),
                    error=str(exc),
                )
        self.tracker.forget(revoked)
        self._forget(revoked)
        self.assigned -= revoked
        kept = {tp.partition for tp in self.assigned}
        self.state.revoke({tp.partition for tp in revoked} - kept)
        self.metrics.assigned_partitions.set(len(self.assigned))


def _show(tps: set[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)
