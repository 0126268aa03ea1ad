"""End-to-end latency: from a record's timestamp to its outputs acknowledged by the broker.

At-least-once means a batch's outputs are acknowledged, at the latest, by the checkpoint
that commits past it (``Checkpointer`` waits for every ack before committing). So each
fetched batch leaves (end offset, oldest timestamp) here, and each commit observes the
batches it covers: one histogram observation per batch and reading agent, from the
batch's oldest record (the worst latency in it) to the acknowledgement.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..metrics import Metrics
from ..records import TopicPartition

__all__ = ["LatencyTracker"]


class LatencyTracker:
    """Batches fetched but not committed yet, per partition, and their timestamps."""

    def __init__(self, metrics: Metrics, readers: dict[str, list[str]]) -> None:
        # The histogram children of each topic's reading agents, resolved once.
        self._children: dict[str, list[Any]] = {
            topic: [metrics.e2e_latency.labels(agent) for agent in agents]
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
