"""One partition's database of a windowed store on disk whose changes wait in memory until
the changelog has them (session tables, ``session_disk.py``; sliding tables,
``sliding_disk.py``), with time orders kept as keys of the database.

Changes wait in two layers: ``pending`` (since the last drain) and ``draining`` (drained:
sent to the changelog, not yet acknowledged); ``persist`` writes the drained layer with
the ``Stamp`` offset it reflects, in one atomic batch, once the changelog has it; reads
look at the layers first.

A time order is the keys of one prefix: prefix + a time (8 bytes, big-endian and offset
by 2**63, so they sort in time order) + what the entry stands for. The entries due first
are the first keys of the prefix; those not on disk yet wait in a heap per layer, so
taking the due entries reads the disk only when one there may be due. Most entries are
short-lived (a window's close entry is due within its size and grace): one added and
taken, or dropped, before the next drain was in no other layer nor on disk, so it leaves
no trace, no tombstone for the database to write and compact away.

>>> entry = b"x" + at(10_000) + b'"a"'
>>> entry_time(entry), entry[9:]
(10000, b'"a"')
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ...errors import DecodeError
from ..databases import STAMP, open_database
from ..local import Stamp
from ..memtables import Unflushed, flush_if_due

__all__ = ["MIRROR", "LayeredDatabase", "at", "entry_time"]

MIRROR = b"k"
"""The prefix under which a store keeps a copy of a changelog record of what it holds in
memory (``disk_mirrored.py``), in a partition's database: ``MIRROR`` + the record's key."""

_MISSING: Any = object()
_INF = 2**63

D = TypeVar("D", bound="LayeredDatabase")


def at(ms: int) -> bytes:
    """A time as 8 bytes that sort in time order; ``DecodeError`` for one outside int64
    (anyone may write the changelog)."""
    try:
        return (ms + _INF).to_bytes(8, "big")
    except OverflowError:
        raise DecodeError(f"a time beyond 64 bits: {ms}") from None


def entry_time(entry: bytes) -> int:
    """The time an entry of a time order is due."""
    return int.from_bytes(entry[1:9], "big") - _INF


class _Order:
    """Where the entries of one time order are: those not on disk yet, in a heap per
    layer; on disk, none before ``disk_from`` is live and none is due before
    ``disk_due``."""

    __slots__ = ("disk_due", "disk_from", "draining", "pending")

    def __init__(self, prefix: bytes) -> None:
        self.pending: list[bytes] = []
        self.draining: list[bytes] = []
        self.disk_from = prefix
        self.disk_due = -_INF


class LayeredDatabase:
    """One partition's database, its stamp, its layers of unwritten changes and its time
    orders (one per prefix of ``order_prefixes``)."""

    __slots__ = (
        "born",
        "db",
        "draining",
        "orders",
        "pending",
        "rocksdict",
        "stamp",
        "unflushed",
    )

    order_prefixes: ClassVar[tuple[bytes, ...]] = ()

    def __init__(self, rocksdict: Any, db: Any, stamp: Stamp) -> None:
        self.rocksdict = rocksdict
        self.db = db
        self.stamp = stamp
        self.pending: dict[bytes, bytes | None] = {}
        self.draining: dict[bytes, bytes | None] = {}
        self.orders = {prefix: _Order(prefix) for prefix in self.order_prefixes}
        # Entries of the orders added since the last drain that no other layer held then,
        # nor the disk beyond an order's ``disk_from`` (``take_due`` checks the disk).
        self.born: set[bytes] = set()
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only

    @classmethod
    def open(
        cls: type[D], rocksdict: Any, path: Path, want: Stamp, table: str, lock_tries: int
    ) -> D:
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
        pending = self.pending
        if entry not in pending and entry not in self.draining:
            self.born.add(entry)
        pending[entry] = b""
        heapq.heappush(self.orders[entry[:1]].pending, entry)

    def drop_due(self, entry: bytes) -> None:
        """Take ``entry`` out of its order (the heaps find it gone when they reach it)."""
        pending = self.pending
        if (
            entry in self.born or (entry not in pending and entry not in self.draining)
        ) and self.db.get(entry) is None:
            # In no other layer, nor on disk: no trace to leave.
            self.born.discard(entry)
            pending.pop(entry, None)
        else:
            pending[entry] = None

    def take_due(self, prefix: bytes, before: int) -> list[bytes]:
        """Take out of the order ``prefix`` the live entries due before ``before``, in key
        order (by time first). An entry deleted (``put(entry, None)``) is not live."""
        order = self.orders[prefix]
        heaps = (order.pending, order.draining)
        if before <= min([order.disk_due, *(entry_time(h[0]) for h in heaps if h)]):
            return []
        limit = prefix + at(max(-_INF, min(before, _INF - 1)))
        due: list[bytes] = []
        for h in heaps:
            while h and h[0] < limit:
                due.append(heapq.heappop(h))
        # Read the disk only when an entry there may be due: then every due entry on disk
        # (from ``disk_from``) is in ``on_disk``.
        on_disk: set[bytes] = set()
        if order.disk_due < before:
            order.disk_due = _INF
            for key in self.db.keys(from_key=order.disk_from):
                if key >= limit or not key.startswith(prefix):
                    if key.startswith(prefix):
                        order.disk_due = entry_time(key)
                    break
                on_disk.add(key)
                order.disk_from = key
            due.extend(on_disk)
        out: list[bytes] = []
        pending, draining, born = self.pending, self.draining, self.born
        for entry in sorted(set(due)):
            value = pending.get(entry, _MISSING)
            if value is _MISSING:
                value = draining.get(entry, _MISSING)
                if value is _MISSING and entry not in on_disk:
                    continue  # dropped before it reached another layer
            if value is None:
                continue  # taken, or deleted, since
            if entry in born and entry not in on_disk:
                born.discard(entry)
                del pending[entry]  # in no other layer, nor on disk: no trace to leave
            else:
                pending[entry] = None
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
        self.born.clear()
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
