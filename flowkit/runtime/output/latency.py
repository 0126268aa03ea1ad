"""End-to-end latency: from a record's timestamp to its outputs acknowledged by the broker.

Two figures, both one observation per batch and reading agent, for the batch's oldest
record (the worst latency in it):

- ``flowkit_e2e_latency_seconds`` (``LatencyProbe``): until every record the agent sent
  for the batch is acknowledged. It is sampled: each agent has at most one batch under
  watch, and the next batch it finishes after that one is acknowledged is the next
  sample, so the path of a record pays nothing and a busy agent is still sampled several
  times a second. The publisher says when the records published so far are acknowledged
  (``Publisher.when_acknowledged``), without sending anything early.
- ``flowkit_committed_latency_seconds`` (``LatencyTracker``): until the checkpoint that
  commits the batch's offsets, which also waits for the tables' changelogs. So it
  includes up to one commit interval; it says when a restart would no longer process
  the record again.

Under exactly-once, outputs become readable when their transaction commits: both
figures are then taken at the commit.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ...metrics import Metrics
from ...records import TopicPartition

if TYPE_CHECKING:
    from .publisher import Publisher

__all__ = ["LatencyProbe", "LatencyProbes", "LatencyTracker"]


class LatencyTracker:
    """Batches fetched but not committed yet, per partition, and their timestamps."""

    def __init__(
        self, metrics: Metrics, readers: dict[str, list[str]], *, outputs_at_commit: bool
    ) -> None:
        # The histogram children of each topic's reading agents, resolved once; with
        # ``outputs_at_commit`` (exactly-once) the end-to-end one too.
        histograms = [metrics.committed_latency]
        if outputs_at_commit:
            histograms.append(metrics.e2e_latency)
        self._children: dict[str, list[Any]] = {
            topic: [h.labels(agent) for agent in agents for h in histograms]
            for topic, agents in readers.items()
        }
        self._pending: dict[TopicPartition, deque[tuple[int, int]]] = {}

    def fetched(self, tp: TopicPartition, end: int, oldest_ms: int) -> None:
        """A batch ending before offset ``end`` whose oldest record has ``oldest_ms``."""
        queue = self._pending.get(tp)
        if queue is None:
            queue = self._pending[tp] = deque()
        queue.append((end, oldest_ms))

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        """Every output up to ``offsets`` is acknowledged: observe the batches covered."""
        now_ms = time.time() * 1000
        for tp, offset in offsets.items():
            queue = self._pending.get(tp)
            children = self._children.get(tp.topic)
            while queue and queue[0][0] <= offset:
                _, oldest = queue.popleft()
                if children and oldest > 0:
                    seconds = max(now_ms - oldest, 0.0) / 1000
                    for child in children:
                        child.observe(seconds)

    def forget(self, tps: set[TopicPartition]) -> None:
        """Drop the batches of revoked partitions."""
        for tp in tps:
            self._pending.pop(tp, None)


class LatencyProbe:
    """One agent's sampled end-to-end latency: at most one batch under watch."""

    __slots__ = ("busy", "child", "publisher")

    def __init__(self, publisher: Publisher, child: Any) -> None:
        self.publisher = publisher
        self.child = child  # the agent's histogram child
        self.busy = False

    def done(self, oldest_ms: int) -> None:
        """The agent is done with a batch whose oldest record has ``oldest_ms``: watch
        it, unless a batch is under watch already (or the record has no timestamp)."""
        if self.busy or oldest_ms <= 0:
            return
        self.busy = True
        self.publisher.when_acknowledged(functools.partial(self._acknowledged, oldest_ms))

    def _acknowledged(self, oldest_ms: int, ok: bool) -> None:
        self.busy = False
        if ok:  # a failed send is the checkpoint's to report, not a latency
            self.child.observe(max(time.time() * 1000 - oldest_ms, 0.0) / 1000)


class LatencyProbes:
    """The probes of one worker's agents, made on first use."""

    def __init__(self, publisher: Publisher, metrics: Metrics) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._probes: dict[str, LatencyProbe] = {}

    def of(self, agent: str) -> LatencyProbe:
        """``agent``'s probe."""
        probe = self._probes.get(agent)
        if probe is None:
            child = self._metrics.e2e_latency.labels(agent)
            probe = self._probes[agent] = LatencyProbe(self._publisher, child)
        return probe
