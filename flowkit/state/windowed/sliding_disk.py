"""One partition of a sliding table on disk: a RocksDB database, and the changes not yet
written to it.

The database holds what the partition's changelog holds, under the ``Stamp`` (the
changelog offset the data reflects) of the plain ``rocksdb://`` tables:

* ``R`` + key: the key's records ``[[time, value], ...]`` by time (the changelog has a
  record per key and time; here a key's are one value, read and written whole);
* ``c`` + end + time + key: the close order, one entry per window still to close (the
  window ending at the record at ``time`` when ``end == time``, else the one starting
  just after it), so the windows due to close are the first keys of ``c``;
* ``x`` + when + key: the expiry order, when the key's earliest record may leave;
* ``k`` + a changelog key: a record of what the worker keeps in memory while it runs
  (each source partition's stream time, the owner's sources' watermarks and sequence
  numbers, the last offset whose records closed windows), as the changelog has it;
* ``n``: how many keys have records (for metrics, without counting them).

Keys are JSON, as in the changelog; times 8 bytes, big-endian and offset by 2**63, so they
sort in time order. Changes wait in two layers, as the session tables' (``session_disk.py``):
``pending`` (since the last drain) and ``draining`` (drained: sent to the changelog, not
yet acknowledged); ``persist`` writes the drained layer with the offset it reflects, in
one atomic batch, once the changelog has it; reads look at the layers first.

>>> entry = CLOSING + at(10_000) + at(0) + b'"a"'
>>> entry_time(entry), parse_closing(entry)
(10000, (10000, 0, b'"a"'))
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..databases import STAMP, open_database
from ..local import Stamp
from ..memtables import Unflushed, flush_if_due
from .session_disk import at

__all__ = [
    "CLOSING",
    "COUNT",
    "EXPIRING",
    "MIRROR",
    "RECORDS",
    "SlidingDisk",
    "at",
    "entry_time",
    "parse_closing",
]

RECORDS = b"R"
CLOSING = b"c"
EXPIRING = b"x"
MIRROR = b"k"
COUNT = b"n"

FORMAT = 104
"""The stamp's format for a sliding table's database (a tumbling table's is 101, a session
table's 103: a table declared again with other windows does not read the other's data)."""

_MISSING: Any = object()
_INF = 2**63


def entry_time(entry: bytes) -> int:
    """The time an entry of an order (``c`` or ``x``) is due."""
    return int.from_bytes(entry[1:9], "big") - _INF


def parse_closing(entry: bytes) -> tuple[int, int, bytes]:
    """(end, record time, key as JSON) of a close-order entry."""
    return entry_time(entry), int.from_bytes(entry[9:17], "big") - _INF, entry[17:]


class _Order:
    """Where the entries of one time order (a prefix) are: those not on disk yet, in a
    heap per layer; on disk, none before ``disk_from`` is live and none is due before
    ``disk_due`` (so taking the due entries reads the disk only when one may be due)."""

    __slots__ = ("disk_due", "disk_from", "draining", "pending", "prefix")

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.pending: list[bytes] = []
        self.draining: list[bytes] = []
        self.disk_from = prefix
        self.disk_due = -_INF


class SlidingDisk:
    """One partition's database, its stamp and its layers of unwritten changes."""

    __slots__ = ("db", "draining", "orders", "pending", "rocksdict", "stamp", "unflushed")

    def __init__(self, rocksdict: Any, db: Any, stamp: Stamp) -> None:
        self.rocksdict = rocksdict
        self.db = db
        self.stamp = stamp
        self.pending: dict[bytes, bytes | None] = {}
        self.draining: dict[bytes, bytes | None] = {}
        self.orders = {CLOSING: _Order(CLOSING), EXPIRING: _Order(EXPIRING)}
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only

    @classmethod
    def open(
        cls, rocksdict: Any, path: Path, want: Stamp, table: str, lock_tries: int
    ) -> SlidingDisk:
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

    # -- time orders ----------------------------------------------------------------------

    def add_due(self, entry: bytes) -> None:
        """Add ``entry`` (a prefix of an order, a time, then what it stands for)."""
        self.pending[entry] = b""
        heapq.heappush(self.orders[entry[:1]].pending, entry)

    def drop_due(self, entry: bytes) -> None:
        """Take ``entry`` out of its order (the heaps find it gone when they reach it)."""
        self.pending[entry] = None

    def take_due(self, prefix: bytes, before: int) -> list[bytes]:
        """Take out of the order ``prefix`` the entries due before ``before``, in key
        order (by time first)."""
        order = self.orders[prefix]
        heaps = (order.pending, order.draining)
        if before <= min([order.disk_due, *(entry_time(h[0]) for h in heaps if h)]):
            return []
        limit = prefix + at(max(-_INF, min(before, _INF - 1)))
        due: list[bytes] = []
        for h in heaps:
            while h and h[0] < limit:
                due.append(heapq.heappop(h))
        order.disk_due = _INF
        for key in self.db.keys(from_key=order.disk_from):
            if key >= limit or not key.startswith(prefix):
                if key.startswith(prefix):
                    order.disk_due = entry_time(key)
                break
            due.append(key)
            order.disk_from = key
        out: list[bytes] = []
        for entry in sorted(set(due)):
            value = self.pending.get(entry, _MISSING)
            if value is _MISSING:
                value = self.draining.get(entry, _MISSING)
            if value is None:
                continue  # taken, or dropped, since
            self.pending[entry] = None
            out.append(entry)
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
        for order in self.orders.values():
            if order.pending:
                order.draining.extend(order.pending)
                heapq.heapify(order.draining)
                order.pending = []

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
        for order in self.orders.values():
            if order.draining:
                # Now on disk: the disk's order holds them.
                first = min(order.draining)
                order.disk_due = min(order.disk_due, entry_time(first))
                order.disk_from = min(order.disk_from, first)
                order.draining = []

    def write_now(self, offset: int) -> None:
        """Write every change (a recovery's: nothing else touched the partition), with
        ``offset``."""
        self.drain()
        self.persist(offset)

    def close(self) -> None:
        """Close the database."""
        self.db.close()
