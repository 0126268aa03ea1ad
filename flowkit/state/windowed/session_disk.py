"""One partition of a session table on disk: a RocksDB database, and the changes not yet
written to it.

The database holds what the partition's changelog holds, under the ``Stamp`` (the
changelog offset the data reflects) of the plain ``rocksdb://`` tables:

* ``k`` + a changelog key: a record of what the worker keeps in memory while it runs (a
  source partition's open sessions of a key, its stream time; an owner's open sessions
  of a key, its sources' watermarks, the last offset whose records closed sessions),
  as the changelog has it: a restart reads them back instead of the changelog;
* ``C`` + key: a key's closed sessions (the changelog's value), read from here only;
* ``x`` + end + start + key: the expiry order of the closed sessions, so that the
  sessions due to expire are the first keys of ``x`` (times 8 bytes, big-endian and
  offset by 2**63, so they sort in time order).

Keys are JSON, as in the changelog. Changes wait in two layers, as the tumbling tables'
(``disk.py``): ``pending`` (since the last drain) and ``draining`` (drained: sent to the
changelog, not yet acknowledged); ``persist`` writes the drained layer with the offset it
reflects, in one atomic batch, once the changelog has it; reads look at the layers first.

>>> end, start = at(10_000), at(0)
>>> expiry_key(b'"a"', 0, 10_000) == EXPIRY + end + start + b'"a"'
True
>>> parse_expiry(expiry_key(b'"a"', 0, 10_000))
(b'"a"', 0)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import DecodeError
from ..databases import STAMP, open_database
from ..local import Stamp
from ..memtables import Unflushed, flush_if_due
from . import wire

__all__ = ["CLOSED", "EXPIRY", "MIRROR", "SessionDisk", "at", "expiry_key", "parse_expiry"]

MIRROR = b"k"
CLOSED = b"C"
EXPIRY = b"x"

FORMAT = 103
"""The stamp's format for a session table's database (a tumbling table's is 101: a table
declared again with other windows does not read the other's data)."""

_MISSING: Any = object()
_INF = 2**63


def at(ms: int) -> bytes:
    """A time as 8 bytes that sort in time order; ``DecodeError`` for one outside int64
    (anyone may write the changelog)."""
    try:
        return (ms + 2**63).to_bytes(8, "big")
    except OverflowError:
        raise DecodeError(f"a session time beyond 64 bits: {ms}") from None


def expiry_key(kj: bytes, start: int, end: int) -> bytes:
    """The expiry entry of the closed session ``[start, end]`` of the key ``kj`` (JSON)."""
    return EXPIRY + at(end) + at(start) + kj


def parse_expiry(key: bytes) -> tuple[bytes, int]:
    """(the key as JSON, the start) of an expiry entry."""
    return key[17:], int.from_bytes(key[9:17], "big") - 2**63


class SessionDisk:
    """One partition's database, its stamp and its layers of unwritten changes."""

    __slots__ = (
        "db",
        "disk_due",
        "disk_from",
        "draining",
        "draining_due",
        "pending",
        "pending_due",
        "rocksdict",
        "stamp",
        "unflushed",
    )

    def __init__(self, rocksdict: Any, db: Any, stamp: Stamp) -> None:
        self.rocksdict = rocksdict
        self.db = db
        self.stamp = stamp
        self.pending: dict[bytes, bytes | None] = {}
        self.draining: dict[bytes, bytes | None] = {}
        # Expiry entries not on disk yet, in a heap per layer: the first due first.
        self.pending_due: list[bytes] = []
        self.draining_due: list[bytes] = []
        # On disk: no expiry entry before ``disk_from`` is live, and none ends before
        # ``disk_due`` (so ``expire`` reads the disk only when one may be due).
        self.disk_from = EXPIRY
        self.disk_due = -_INF
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only

    @classmethod
    def open(
        cls, rocksdict: Any, path: Path, want: Stamp, table: str, lock_tries: int
    ) -> SessionDisk:
        """The partition's database at ``path``: its own (same stamp), else a fresh one
        (one log line says why the one there is not used)."""
        db, found = open_database(
            rocksdict, path, want, owner=f"table {table!r}", lock_tries=lock_tries
        )
        return cls(rocksdict, db, want if found is None else found)

    # -- reads and writes -----------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``: the newest layer's, else the disk's."""
        value = self.pending.get(key, _MISSING)
        if value is _MISSING:
            value = self.draining.get(key, _MISSING)
            if value is _MISSING:
                found: bytes | None = self.db.get(key)
                return found
        return value  # type: ignore[no-any-return]

    def put(self, key: bytes, value: bytes | None) -> None:
        """Set (or, with None, delete) ``key`` at the next persist after a drain."""
        self.pending[key] = value

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every live key that begins with ``prefix``, in key order (the
        layers' changes over the disk's; a restart's and a listing's, not a record's)."""
        overlay = {k: v for k, v in self.draining.items() if k.startswith(prefix)}
        overlay.update((k, v) for k, v in self.pending.items() if k.startswith(prefix))
        merged: dict[bytes, bytes | None] = {}
        for key, value in self.db.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            merged[key] = value
        merged.update(overlay)
        for key in sorted(merged):
            value = merged[key]
            if value is not None:
                yield key, value

    # -- closed sessions ------------------------------------------------------------------

    def keep_closed(self, kj: bytes, start: int, end: int, session: bytes) -> None:
        """Add the closed session ``session`` (``[start, end, value]`` as JSON) to the
        key's, and to the expiry order."""
        key = CLOSED + kj
        raw = self.get(key)
        self.put(key, b"[" + session + b"]" if raw is None else raw[:-1] + b"," + session + b"]")
        entry = expiry_key(kj, start, end)
        self.put(entry, b"")
        heapq.heappush(self.pending_due, entry)

    def set_closed(self, kj: bytes, old: list[list[Any]], new: list[list[Any]] | None) -> None:
        """Replace the key's closed sessions ``old`` by ``new`` (None or empty: none);
        ``DecodeError`` before any change for a time beyond 64 bits."""
        gone = [expiry_key(kj, s[0], s[1]) for s in old]
        fresh = [expiry_key(kj, s[0], s[1]) for s in new or ()]
        self.put(CLOSED + kj, wire.encode(new) if new else None)
        for entry in gone:
            self.put(entry, None)
        for entry in fresh:
            self.put(entry, b"")
            heapq.heappush(self.pending_due, entry)

    def expire(self, before: int) -> dict[bytes, list[int]]:
        """Take out of the expiry order the closed sessions that end before ``before``:
        key (as JSON) -> their starts. The caller removes them from the key's sessions."""
        heaps = (self.pending_due, self.draining_due)
        first = min([self.disk_due, *(_end_of(h[0]) for h in heaps if h)])
        if before <= first:
            return {}
        limit = EXPIRY + at(before)
        due: list[bytes] = []
        for h in heaps:
            while h and h[0] < limit:
                due.append(heapq.heappop(h))
        self.disk_due = _INF
        for key in self.db.keys(from_key=self.disk_from):
            if key >= limit or not key.startswith(EXPIRY):
                if key.startswith(EXPIRY):
                    self.disk_due = _end_of(key)
                break
            due.append(key)
            self.disk_from = key
        out: dict[bytes, list[int]] = {}
        for entry in sorted(set(due)):
            value = self.pending.get(entry, _MISSING)
            if value is _MISSING:
                value = self.draining.get(entry, _MISSING)
            if value is None:
                continue  # expired, or replaced, since
            self.put(entry, None)
            kj, start = parse_expiry(entry)
            out.setdefault(kj, []).append(start)
        return out

    # -- checkpoints ----------------------------------------------------------------------

    def drain(self) -> None:
        """What changed so far goes with the changes drained for the changelog."""
        if self.pending:
            if self.draining:
                self.draining.update(self.pending)
            else:
                self.draining = self.pending
            self.pending = {}
        if self.pending_due:
            self.draining_due.extend(self.pending_due)
            heapq.heapify(self.draining_due)
            self.pending_due = []

    def persist(self, offset: int) -> None:
        """Write the drained changes, stamped with the changelog offset they reflect, in
        one atomic batch."""
        if not self.draining and offset == self.stamp.offset:
            return
        batch = self.rocksdict.WriteBatch(raw_mode=True)
        for key, value in self.draining.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self.stamp = self.stamp.with_offset(max(offset, self.stamp.offset))
        batch.put(STAMP, self.stamp.encode())
        self.unflushed.wrote(batch.len())
        self.db.write(batch)
        flush_if_due(self.db, self.unflushed)
        self.draining = {}
        if self.draining_due:
            # Now on disk: the disk's order holds them.
            first = min(self.draining_due)
            self.disk_due = min(self.disk_due, _end_of(first))
            self.disk_from = min(self.disk_from, first)
            self.draining_due = []

    def write_now(self, offset: int) -> None:
        """Write every change (a recovery's: nothing else touched the partition), with
        ``offset``."""
        self.drain()
        self.persist(offset)

    def close(self) -> None:
        """Close the database."""
        self.db.close()


def _end_of(entry: bytes) -> int:
    return int.from_bytes(entry[1:9], "big") - 2**63
