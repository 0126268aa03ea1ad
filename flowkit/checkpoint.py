"""Which offsets may be committed: the one ``OffsetTracker``.

Invariant: for each partition, the committable offset is the end offset of the longest
prefix of dispatched batches that every agent instance has finished. A batch still being
processed, or queued, holds back every batch after it, so a commit never passes a record
whose effects are not done. Sends caused by done records are awaited by the worker before
it commits (see ``Worker.checkpoint``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from .records import TopicPartition

__all__ = ["OffsetTracker", "PendingBatch"]


class PendingBatch:
    """A dispatched batch: its end offset and how many agent instances still hold it.

    ``progress``, when set (a batch with one holder), returns the offset of the record
    the holder is on: the records before it are done, so a commit may stop there.
    """

    __slots__ = ("end", "first_ts", "holders", "progress", "start")

    def __init__(self, end: int, holders: int, start: int = -1, first_ts: int = -1) -> None:
        self.end = end
        self.holders = holders
        self.start = start  # the offset of its first record (-1: not said)
        self.first_ts = first_ts  # that record's timestamp, ms (-1: not said)
        self.progress: Callable[[], int | None] | None = None

    def release(self) -> None:
        """One holder is done with the batch."""
        self.holders -= 1
        if self.holders <= 0:
            # ``progress`` refers to the batch, whose ``on_done`` is this method: drop it,
            # so the done batch (and its records) is freed now, not by a later gc pass.
            self.progress = None


class OffsetTracker:
    """Tracks dispatched batches per partition and answers what can be committed.

    >>> t = OffsetTracker()
    >>> tp = TopicPartition("t", 0)
    >>> a, b = t.add(tp, 10, 1), t.add(tp, 20, 1)
    >>> b.release(); t.committable()       # b is done but a is not: nothing yet
    {}
    >>> a.release(); t.committable()
    {TopicPartition(topic='t', partition=0): 20}
    """

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, deque[PendingBatch]] = {}
        self._done: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def add(
        self, tp: TopicPartition, end: int, holders: int, start: int = -1, first_ts: int = -1
    ) -> PendingBatch:
        """Record a batch ending before offset ``end``, held by ``holders`` instances (its
        first record at ``start``, with timestamp ``first_ts``: for ``unprocessed``)."""
        entry = PendingBatch(end, holders, start, first_ts)
        queue = self._pending.get(tp)
        if queue is None:
            queue = self._pending[tp] = deque()
        queue.append(entry)
        return entry

    def _advance(self, tp: TopicPartition) -> None:
        queue = self._pending.get(tp)
        if not queue:
            return
        end = None
        while queue and queue[0].holders <= 0:
            end = queue.popleft().end
        if end is not None:
            self._done[tp] = end
        if queue and queue[0].progress is not None:
            # Part of the oldest batch is done: commit up to the record being processed.
            offset = queue[0].progress()
            if offset is not None and offset > self._done.get(tp, -1):
                self._done[tp] = offset

    def committable(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Offsets (next to read) that advanced past the last commit, per partition."""
        out: dict[TopicPartition, int] = {}
        for tp in list(self._pending) if tps is None else tps:
            self._advance(tp)
            done = self._done.get(tp)
            if done is not None and done != self._committed.get(tp):
                out[tp] = done
        return out

    def unprocessed(self, tp: TopicPartition) -> tuple[int | None, int | None]:
        """The offset of the first record of ``tp`` not processed yet, and the timestamp
        (ms) of the oldest batch still held: (None, None) when nothing is known, and
        (offset, None) when every batch fetched is done.

        >>> t = OffsetTracker()
        >>> tp = TopicPartition("t", 0)
        >>> a = t.add(tp, 10, 1, start=0, first_ts=1000)
        >>> t.unprocessed(tp)          # fetched, none processed: all ten are lag
        (0, 1000)
        >>> a.release(); t.unprocessed(tp)
        (10, None)
        """
        self._advance(tp)
        done = self._done.get(tp)
        queue = self._pending.get(tp)
        if not queue:
            return done, None
        oldest = queue[0]
        first = done if done is not None else (oldest.start if oldest.start >= 0 else None)
        return first, oldest.first_ts if oldest.first_ts >= 0 else None

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        """Note a successful commit."""
        self._committed.update(offsets)

    def last_committed(self) -> dict[TopicPartition, int]:
        """The offsets of the last commit, per partition still held."""
        return dict(self._committed)

    def in_flight(self, tps: Iterable[TopicPartition] | None = None) -> int:
        """How many dispatched batches are not done yet."""
        count = 0
        for tp in list(self._pending) if tps is None else tps:
            self._advance(tp)
            count += len(self._pending.get(tp, ()))
        return count

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop all state of partitions this worker no longer owns."""
        for tp in tps:
            self._pending.pop(tp, None)
            self._done.pop(tp, None)
            self._committed.pop(tp, None)
