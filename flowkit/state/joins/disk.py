"""A join over buffers held in a database (``layout.py``): what stays in memory, and matching.

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

A record is matched by one range of its key on the other side (disk, then fresh records),
here; windows close and records expire by scans of the time index (``diskscans.py``); a
checkpoint writes the changes and lets the fresh records go (``rocks.py``). One partition's
buffers and database are a ``DiskJoinPart`` (``diskpart.py``).
"""

from __future__ import annotations

from heapq import heappush
from typing import Any

from .diskpart import DISK, OUT, DiskJoinPart, stored_key
from .diskscans import DiskScans
from .layout import MATCHED, at, record_key, record_prefix
from .store import DIRTY, GONE, LOGGED, Joined, JoinPart

__all__ = ["DiskJoinStore"]

_new = tuple.__new__


class DiskJoinStore(DiskScans):
    """``JoinStore`` over buffers in a database; ``RocksJoinStore`` opens and writes them."""

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

    # -- values ---------------------------------------------------------------------------

    def _value(self, part: JoinPart, entry: list[Any]) -> Any:
        raw = entry[2]
        if raw is not None:
            return super()._value(part, entry)
        # On disk only: read and decoded for this use, not kept.
        assert isinstance(part, DiskJoinPart)
        return self._decode[entry[6]](self._stored(part, entry))
