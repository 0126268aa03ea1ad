"""A join's matching, closing and expiry over buffers held in a database (``layout.py``).

The same join as ``JoinStore`` (the same results from the same records), with the records
of both sides in the database rather than in memory. What stays in memory is bounded by
what a checkpoint writes, not by the records buffered:

* the records read since the last checkpoint (*fresh*: in ``buffers`` by key and, while
  they may still come out unmatched, in a heap per side), written to the database at the
  next checkpoint and dropped from memory then;
* the records on disk that changed since (matched, come out unmatched, expired) or that
  the record being processed closed or expired (``touched``, by stored key), written at
  the next checkpoint too;
* per side, how far the time index has been scanned for closing windows, and a cursor
  there.

A record is matched by one range of its key on the other side (disk, then fresh records);
a window closes by a scan of the side's time index from where the last one stopped; and
records expire by a scan of the time index up to the stream time minus the retention,
once per ``slack`` of stream time, deleted from disk at the checkpoint that tells the
changelog. The database changes only at checkpoints (and recovery), so between two of them
its time index is read by one iterator per side.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from ...errors import NotRunningError
from ..databases import open_rocksdict
from ..memtables import Unflushed
from .disktimes import BUCKETS, DiskTimes
from .layout import (
    MATCHED,
    TIMES,
    UNMATCHED,
    at,
    record_key,
    record_key_of,
    record_prefix,
    side_end,
    side_prefix,
    time_of,
    unpack,
)
from .store import DIRTY, GONE, LEFT, LOGGED, NEVER, NONE, RIGHT, Joined, JoinPart, JoinStore

if TYPE_CHECKING:
    from ..local import Stamp
    from .declaration import StreamJoin

__all__ = ["DISK", "STORED", "DiskJoinPart", "DiskJoinStore", "stored_key"]

# More flags of an entry (see ``store.py``): its record is in the database; an expiry scan
# took it (settled with the record that did).
DISK, OUT = 8, 16
# An entry here has one more field than ``store.py``'s: its record's key in the database
# (``layout.record_key``), or None until one is needed.
STORED = 8
_new = tuple.__new__


def stored_key(entry: list[Any]) -> bytes:
    """The key of ``entry``'s record in the database, kept on the entry once built."""
    stored: bytes | None = entry[8]
    if stored is None:
        stored = entry[8] = record_key(entry[6], entry[4], entry[0], entry[5])
    return stored


class DiskJoinPart(JoinPart):
    """The buffers of one partition, with its database."""

    __slots__ = (
        "ahead",
        "closed",
        "cursors",
        "cut",
        "db",
        "encoded",
        "evict",
        "expired",
        "fresh",
        "fresh_low",
        "on_disk",
        "reader",
        "stamp",
        "started",
        "top",
        "touched",
        "unflushed",
    )

    def __init__(self, number: int, db: Any, stamp: Stamp, buckets: int = BUCKETS) -> None:
        super().__init__(number)
        self.db = db
        self.stamp = stamp
        # Per side: which keys may have records on disk, from when (a match reads the
        # database only where they may).
        self.on_disk = (DiskTimes(buckets), DiskTimes(buckets))
        # Drained to the changelog, written to disk at the next persist: (entry, stored
        # value or None to delete), in drain order; and the fresh entries among them.
        self.encoded: list[tuple[list[Any], bytes | None]] = []
        self.evict: list[list[Any]] = []
        self.touched: dict[bytes, list[Any]] = {}
        # Per side: the time index below ``closed`` has been scanned for closing windows;
        # ``ahead`` is the time of the first record at or past it (NEVER: none), and
        # ``cursors`` an iterator standing there (None: seek again, after a write).
        self.closed = [NONE, NONE]
        self.ahead = [NEVER, NEVER]
        self.cursors: list[Any] = [None, None]
        # Per side: the time index below this was scanned for expiry; and below ``cut``
        # the next write deletes it whole (what an expiry scan took, all drained since).
        self.expired = [NONE, NONE]
        self.cut = [NONE, NONE]
        self.reader: Any = None  # an iterator for matches (None: a new one, after a write)
        self.fresh = 0  # records not yet on disk
        self.fresh_low = NEVER  # the oldest fresh record's time
        self.top = [-1, -1]  # the highest offset buffered per side: above it, no replay
        self.started = False  # the due times known (``DiskJoinStore._start``)
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only

    def forget_cursors(self) -> None:
        """The database changed (or closes): the iterators over it go."""
        self.cursors = [None, None]
        self.reader = None


class DiskJoinStore(JoinStore):
    """``JoinStore`` over buffers in a database; ``RocksJoinStore`` opens and writes them."""

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

    # -- processing -----------------------------------------------------------------------

    def process(  # type: ignore[override]
        self,
        part: DiskJoinPart,
        side: int,
        key: bytes,
        offset: int,
        ts: int,
        raw: bytes,
        value: Any,
    ) -> list[Joined] | None:
        """As ``JoinStore.process``; the other side's records of ``key`` within the window
        are read from disk (one range) and from the fresh ones."""
        if offset <= part.replayed[side]:
            return None  # recovered with the state: processed before the restart
        time = part.time
        if ts > time:
            part.time = time = ts
        close = ts + self._close[side]
        if close < time:
            self._late(part, side, ts)
        out: list[Joined] | None = None
        matched = False
        before, after = self._window[side]
        found = self._find(part, 1 - side, key, ts - before, ts + after)
        if found:
            matched = True
            okey = self._decode_key(key)
            emits = self._emits_unmatched[1 - side]
            out = []
            for entry in found:
                t = entry[0]
                if emits and not entry[1]:
                    entry[1] = True  # the changelog must know: it will not come out alone
                    self._dirty(part, entry)
                theirs = entry[3]
                if theirs is None:
                    theirs = self._value(part, entry)
                if side:
                    out.append(_new(Joined, (okey, theirs, value, t if t > ts else ts)))
                else:
                    out.append(_new(Joined, (okey, value, theirs, t if t > ts else ts)))
        if offset <= part.top[side]:
            e = self._buffered(part, side, key, ts, offset)
            if e is not None:  # replayed after a restart: buffered already
                return self._replayed(part, e, matched, out)
        entry = [ts, matched, raw, value, key, offset, side, DIRTY, None]
        mine = part.buffers[side]
        entries = mine.get(key)
        if entries is None:
            mine[key] = [entry]
        else:
            for e in entries:
                if e[5] == offset:
                    return self._replayed(part, e, matched, out)
            entries.append(entry)
        part.dirty.append(entry)
        part.fresh += 1
        if ts < part.fresh_low:
            part.fresh_low = ts
        expiring = part.expiring  # (expired before a checkpoint, it is never written)
        if expiring and ts < expiring[-1][0]:
            heappush(part.late[0], (ts, side, offset, entry))
        else:
            expiring.append(entry)
        due = ts + self._keep
        if due < part.expire_due:
            part.expire_due = due
            if due < part.due:
                part.due = due
        if self._emits_unmatched[side] and not matched:
            heappush(part.late[1 + side], (ts, offset, entry))
            if close < part.close_due:
                part.close_due = close
                if close < part.due:
                    part.due = close
        if time > part.due:
            unmatched = self.advance(part)
            if unmatched:
                if out is None:
                    return unmatched
                out.extend(unmatched)
        return out

    def _find(self, part: DiskJoinPart, side: int, key: bytes, lo: int, hi: int) -> list[Any]:
        """The entries of ``key``'s records of ``side`` with times in ``[lo, hi]``."""
        found: list[Any] = []
        if part.on_disk[side].may_hold(key, lo):
            self._read(part, side, key, lo, hi, found)
        fresh = part.buffers[side].get(key)
        if fresh:
            for e in fresh:
                if lo <= e[0] <= hi:
                    found.append(e)
        return found

    @staticmethod
    def _read(
        part: DiskJoinPart, side: int, key: bytes, lo: int, hi: int, found: list[Any]
    ) -> None:
        """Add to ``found`` the entries of ``key``'s records of ``side`` on disk with times
        in ``[lo, hi]`` (one range of the database)."""
        prefix = record_prefix(side, key)
        end = prefix + at(hi + 1)
        cut = len(prefix)
        touched = part.touched
        it = part.reader
        if it is None:
            it = part.reader = part.db.iter()
        it.seek(prefix + at(lo))
        while it.valid():
            stored = it.key()
            if stored >= end:
                break
            e = touched.get(stored)
            if e is None:
                v = it.value()
                ts = int.from_bytes(stored[cut : cut + 8], "big") - 2**63
                offset = int.from_bytes(stored[cut + 8 :], "big") - 2**63
                e = [ts, v[:1] == MATCHED, v[1:], None, key, offset, side, LOGGED | DISK, stored]
                found.append(e)
            elif not e[7] & (GONE | OUT):
                found.append(e)
            it.next()

    @staticmethod
    def _buffered(
        part: DiskJoinPart, side: int, key: bytes, ts: int, offset: int
    ) -> list[Any] | None:
        """The entry of this record if it is on disk already (read again after a restart)."""
        stored = record_key(side, key, ts, offset)
        e = part.touched.get(stored)
        if e is None:
            v = part.db.get(stored)
            if v is None:
                return None
            e = [ts, v[:1] == MATCHED, None, None, key, offset, side, LOGGED | DISK, stored]
        elif e[7] & GONE:
            return None
        return e

    @staticmethod
    def _changed(part: JoinPart, entry: list[Any]) -> None:
        assert isinstance(part, DiskJoinPart)
        DiskJoinStore._dirty(part, entry)

    @staticmethod
    def _dirty(part: DiskJoinPart, entry: list[Any]) -> None:
        """``entry`` changed: written at the next checkpoint, and the one in memory."""
        flags = entry[7]
        if not flags & DIRTY:
            entry[7] = flags | DIRTY
            part.dirty.append(entry)
            if flags & DISK:
                part.touched[stored_key(entry)] = entry

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

    # -- values ---------------------------------------------------------------------------

    def _value(self, part: JoinPart, entry: list[Any]) -> Any:
        raw = entry[2]
        if raw is not None:
            return super()._value(part, entry)
        # On disk only: read and decoded for this use, not kept.
        assert isinstance(part, DiskJoinPart)
        return self._decode[entry[6]](self._stored(part, entry))

    def _stored(self, part: DiskJoinPart, entry: list[Any]) -> bytes:
        """The value of ``entry``'s record, as read, from disk."""
        stored = part.db.get(stored_key(entry))
        if stored is None:
            raise RuntimeError(
                f"join {self.join.name!r}: a buffered record of partition {part.number} is "
                "missing from its local state"
            )
        return bytes(stored[1:])

    # -- after a checkpoint ---------------------------------------------------------------

    def _written(self, part: DiskJoinPart) -> None:
        """What the last drain held is on disk now: fresh records leave memory."""
        for entry, _ in part.encoded:
            entry[2] = entry[3] = None
        buffers = part.buffers
        low = part.fresh_low
        moved = 0
        expired = part.expired
        for entry in part.evict:  # (one drained twice is listed twice)
            flags = entry[7]
            if not flags & DISK:
                entry[7] = flags | DISK
                if not flags & OUT:  # (expired while fresh: counted then)
                    moved += 1
                if entry[0] < expired[entry[6]]:  # expires at the next scan
                    expired[entry[6]] = entry[0]
        part.fresh -= moved
        if not part.fresh:  # all of them (the usual): nothing fresh left
            part.buffers = buffers = ({}, {})
            part.expiring.clear()
            part.late[0].clear()
        else:
            part.expiring = deque(e for e in part.expiring if not e[7] & DISK)
            late = [item for item in part.late[0] if not item[3][7] & DISK]
            heapify(late)
            part.late = (late, part.late[1], part.late[2])
            for entry in part.evict:
                by_key = buffers[entry[6]]
                entries = by_key.get(entry[4])
                if entries is None:
                    continue  # listed twice: gone already
                for i, e in enumerate(entries):
                    if e is entry:
                        del entries[i]
                        break
                if not entries:
                    del by_key[entry[4]]
        part.encoded, part.evict = [], []
        part.cut = [NONE, NONE]
        part.forget_cursors()
        for side in (LEFT, RIGHT):  # closing: the written ones from the time index now
            heap = part.late[1 + side]
            if heap:
                kept = []
                for item in heap:
                    if item[2][7] & DISK:
                        if item[0] < part.ahead[side]:
                            part.ahead[side] = item[0]
                    else:
                        kept.append(item)
                heapify(kept)
                part.late = (
                    (part.late[0], kept, part.late[2])
                    if side == LEFT
                    else (part.late[0], part.late[1], kept)
                )
        part.fresh_low = (
            min((e[0] for by_key in buffers for es in by_key.values() for e in es), default=NEVER)
            if part.fresh
            else NEVER
        )
        if low != NEVER and low + self._keep < part.expire_due:
            part.expire_due = low + self._keep  # written records expire from disk
            part.due = min(part.due, part.expire_due)
        part.touched = {
            stored_key(e): e for e in (*part.settle, *part.dirty) if e[7] & DISK and not e[7] & GONE
        }
