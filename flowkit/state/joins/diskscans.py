"""A join on disk's scans of its time index (``layout.py``): the due times of what a
database holds when it opens, windows closing, and records expiring.

A window closes by a scan of the side's time index from where the last one stopped; and
records expire by a scan of the time index up to the stream time minus the retention,
once per ``slack`` of stream time, deleted from disk at the checkpoint that tells the
changelog. The database changes only at checkpoints (and recovery), so between two of them
its time index is read by one iterator per side.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop
from typing import TYPE_CHECKING, Any

from ...errors import NotRunningError
from ..databases import open_rocksdict
from .diskpart import DISK, OUT, DiskJoinPart, stored_key
from .disktimes import BUCKETS
from .layout import MATCHED, TIMES, UNMATCHED, record_key_of, side_end, side_prefix, time_of, unpack
from .store import GONE, LEFT, LOGGED, NEVER, NONE, RIGHT, Joined, JoinPart, JoinStore

if TYPE_CHECKING:
    from .declaration import StreamJoin

__all__ = ["DiskScans"]


class DiskScans(JoinStore):
    """``JoinStore`` whose partitions' buffers are in databases (``DiskJoinPart``): their
    time indexes scanned to close windows and expire records; the match path is
    ``disk.DiskJoinStore``'s."""

    parts: dict[int, DiskJoinPart]  # type: ignore[assignment]

    def __init__(
        self, join: StreamJoin, now_ms: Callable[[], int], *, buckets: int = BUCKETS
    ) -> None:
        super().__init__(join, now_ms)
        self.buckets = buckets  # of each side's ``DiskTimes``
        self._rocksdict = open_rocksdict()
        # Per side, read options that end a scan with its time index. They live as long
        # as the store: an iterator refers to its options' bound, it does not copy it.
        self._bounds = tuple(self._bound(side) for side in (LEFT, RIGHT))

    def part(self, partition: int) -> DiskJoinPart:
        """The buffers of ``partition``, which this worker must hold."""
        part = self.parts.get(partition)
        if part is None:
            raise NotRunningError(f"join {self.join.name!r}: partition {partition} not held")
        if not part.started:
            self._start(part)
        return part

    def _start(self, part: DiskJoinPart) -> None:
        """The due times of what the database holds (opened or recovered)."""
        part.started = True
        first, last = [NEVER, NEVER], NONE
        it = part.db.iter()
        for side in (LEFT, RIGHT):
            head = TIMES + bytes((side,))
            it.seek(head)
            if it.valid() and it.key()[:2] == head:
                first[side] = time_of(it.key())
                it.seek_for_prev(TIMES + bytes((side + 1,)))
                latest = time_of(it.key())
                # Written before this process knew them, or by the changelog: any key's.
                part.on_disk[side].held(latest)
                last = max(last, latest)
        del it
        if part.time != NONE and not self.trusts(part.time, part.number):
            # Beyond the guard: it would make every record late. It starts again from
            # what is buffered (every buffered record was read, so stream time is past it).
            part.time = part.done = last
        part.closed = [NONE, NONE]
        part.expired = [NONE, NONE]
        part.ahead = first
        part.forget_cursors()
        part.close_due = min(
            [first[side] + close for side, close in self._closers if first[side] != NEVER],
            default=NEVER,
        )
        oldest = min(first)
        part.expire_due = NEVER if oldest == NEVER else oldest + self._keep
        part.due = min(part.close_due, part.expire_due)

    def _close_windows(self, part: JoinPart, time: int) -> list[Joined] | None:
        assert isinstance(part, DiskJoinPart)
        out: list[Joined] | None = None
        settle = part.settle
        due = NEVER
        for side, close in self._closers:
            limit = time - close  # records before this have closed
            heap = part.late[1 + side]
            taken = []
            while heap and heap[0][0] < limit:
                entry = heappop(heap)[2]
                if not entry[1]:
                    taken.append(entry)
            if part.closed[side] < limit:
                on_disk = self._closing(part, side, limit)
                if on_disk:
                    if taken:
                        taken.extend(on_disk)
                        taken.sort(key=lambda e: (e[0], e[5]))
                    else:
                        taken = on_disk
            for entry in taken:
                settle.append(entry)
                if out is None:
                    out = []
                out.append(self._alone(part, side, entry))
            if heap and heap[0][0] + close < due:
                due = heap[0][0] + close
            ahead = part.ahead[side]
            if ahead != NEVER and ahead + close < due:
                due = ahead + close
        part.close_due = due
        return out

    def _closing(self, part: DiskJoinPart, side: int, limit: int) -> list[list[Any]]:
        """The unmatched records of ``side`` on disk whose windows closed before ``limit``,
        from where the last scan stopped; the scan stops at the next record."""
        it = part.cursors[side]
        if it is None:
            it = part.cursors[side] = self._scan(part, side)
            it.seek(side_prefix(side, part.closed[side]))
        part.closed[side] = limit
        end = side_prefix(side, limit)
        touched = part.touched
        taken = []
        while it.valid():
            stored = it.key()
            if stored >= end:
                break
            if it.value() == UNMATCHED:
                rkey = record_key_of(stored)
                e = touched.get(rkey)
                if e is None:
                    _, key, ts, offset = unpack(stored)
                    e = [ts, False, None, None, key, offset, side, LOGGED | DISK, rkey]
                    e[2] = self._stored(part, e)
                    touched[rkey] = e  # in ``settle``: the one entry of its record
                    taken.append(e)
                elif not e[1] and not e[7] & (GONE | OUT):
                    taken.append(e)
            it.next()
        part.ahead[side] = time_of(it.key()) if it.valid() else NEVER
        return taken

    def _bound(self, side: int) -> Any:
        options = self._rocksdict.ReadOptions()
        options.set_iterate_upper_bound(side_end(side))
        return options

    def _scan(self, part: DiskJoinPart, side: int) -> Any:
        """An iterator over the time index of ``side`` that ends with it (not reading
        the deleted records past it)."""
        return part.db.iter(self._bounds[side])

    def _expire(self, part: JoinPart, time: int) -> None:
        # The records expired by ``time``, taken once (``OUT``) and settled as gone: those
        # on disk are deleted at the next checkpoint; fresh ones leave memory, and were
        # never written (unless a drain took them before they settled: then as on disk).
        assert isinstance(part, DiskJoinPart)
        limit = time - self._retention
        keep = self._keep
        settle = part.settle
        due = self._expire_fresh(part, limit)
        touched = part.touched
        for side in (LEFT, RIGHT):
            # From where the last scan stopped: what is before was taken (and deleted, or
            # to be, at a checkpoint: reading through deleted records is slow).
            it = self._scan(part, side)
            it.seek(side_prefix(side, part.expired[side]))
            part.expired[side] = limit
            end = side_prefix(side, limit)
            while it.valid():
                stored = it.key()
                if stored >= end:
                    break
                rkey = record_key_of(stored)
                e = touched.get(rkey)
                if e is None:
                    _, key, ts, offset = unpack(stored)
                    matched = it.value() == MATCHED
                    e = [ts, matched, None, None, key, offset, side, LOGGED | DISK | OUT, rkey]
                    touched[rkey] = e
                    settle.append(e)
                elif not e[7] & (GONE | OUT):
                    e[7] |= OUT
                    settle.append(e)
                it.next()
            if it.valid() and time_of(it.key()) + keep < due:
                due = time_of(it.key()) + keep
            del it
        part.expire_due = due

    def _expire_fresh(self, part: DiskJoinPart, limit: int) -> int:
        """Take the fresh records older than ``limit`` out of memory; the due time of
        the oldest left."""
        expiring, heap, buffers, settle = part.expiring, part.late[0], part.buffers, part.settle
        while True:
            if expiring and expiring[0][0] < limit:
                entry = expiring.popleft()
            elif heap and heap[0][0] < limit:
                entry = heappop(heap)[3]
            else:
                break
            if entry[7] & (DISK | OUT):
                continue  # written since: it expires from disk
            by_key = buffers[entry[6]]
            entries: list[list[Any]] = by_key.get(entry[4], [])
            for i, e in enumerate(entries):  # the oldest of its key, mostly
                if e is entry:
                    del entries[i]
                    break
            else:
                continue  # (not buffered: nothing to take out)
            if not entries:
                del by_key[entry[4]]
            entry[7] |= OUT
            part.fresh -= 1
            settle.append(entry)
        due = NEVER
        if expiring:
            due = expiring[0][0] + self._keep
        if heap and heap[0][0] + self._keep < due:
            due = heap[0][0] + self._keep
        return due

    def _stored(self, part: DiskJoinPart, entry: list[Any]) -> bytes:
        """The value of ``entry``'s record, as read, from disk."""
        stored = part.db.get(stored_key(entry))
        if stored is None:
            raise RuntimeError(
                f"join {self.join.name!r}: a buffered record of partition {part.number} is "
                "missing from its local state"
            )
        return bytes(stored[1:])
