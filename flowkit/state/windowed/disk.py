"""One partition of a tumbling or hopping table on disk: a RocksDB database, and the
changes not yet written to it.

The database holds what the partition's changelog holds, in keys that sort by window, so
that closing a window reads one prefix and expiring it is one range delete:

* ``o`` + start + key + source: a partial held by the owner of an open window;
* ``c`` + start + key: the final value of a closed window (until it expires);
* ``p`` + start + key: a stage-1 partial of an open window of this source partition;
* ``s`` + source: the watermark the owner holds for a source partition;
* ``w``: this source partition's stream time; ``e``: the last repartition offset whose
  records closed windows; ``k``: where the owner's close in steps has sent results up
  to (the start and the ``o`` key of the last one);

with the ``Stamp`` (the changelog offset the data reflects) under the key the plain
``rocksdb://`` tables use. Starts are 8 bytes, big-endian and offset by 2**63, so they sort
in time order; keys are JSON, as in the changelog; sources are 4 bytes. A JSON key never
holds a zero byte, so a key's entries sort together, before any longer key it begins.

Changes wait in two layers, as the plain tables' do: ``pending`` (since the last drain)
and ``draining`` (drained: sent to the changelog, not yet acknowledged). ``persist``
writes the drained layer with the offset it reflects, in one atomic batch, once the
changelog has it; reads look at the layers first, then at the disk.

How many stage-1 partials each window holds (``partials_held``, for the metric of the
keys a table holds) is counted on disk the first time it is asked after the database
opens or takes changelog records, and kept up to date by the drains from then on.

>>> start(0).hex(), start(-1) < start(0) < start(10_000)
('8000000000000000', True)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...errors import DecodeError
from ..databases import STAMP, open_database
from ..local import Stamp
from ..memtables import Unflushed, flush_if_due

__all__ = ["DiskPart", "Layer", "group_of", "source", "start", "start_of"]

OWNED = b"o"
CLOSED = b"c"
PARTIAL = b"p"
SOURCE_WM = b"s"
WATERMARK = b"w"
EMITTED = b"e"
CURSOR = b"k"
_WINDOWED = (OWNED, CLOSED, PARTIAL)

FORMAT = 101
"""The stamp's format for a windowed table's database (a plain table's is another, so
that a table declared again with windows does not read the other's data)."""


def start(ms: int) -> bytes:
    """A window start as 8 bytes that sort in time order; ``DecodeError`` for one outside
    int64 (anyone may write the internal topics)."""
    try:
        return (ms + 2**63).to_bytes(8, "big")
    except OverflowError:
        raise DecodeError(f"a window start beyond 64 bits: {ms}") from None


def start_of(key: bytes) -> int:
    """The window start of a disk key of kind ``o``, ``c`` or ``p``."""
    return int.from_bytes(key[1:9], "big") - 2**63


def source(n: int) -> bytes:
    """A source partition as 4 bytes."""
    return n.to_bytes(4, "big")


def group_of(key: bytes) -> bytes:
    """What a range delete removes at once: one window of one kind, or one key."""
    return key[:9] if key[:1] in _WINDOWED else key


def _after(group: bytes) -> bytes:
    # The first key past every key that begins with ``group``.
    return (int.from_bytes(group, "big") + 1).to_bytes(len(group), "big")


class Layer:
    """Changes not yet on disk: per group, key -> value (None: deleted), and the groups
    deleted whole before them (``cut``)."""

    __slots__ = ("cut", "groups")

    def __init__(self) -> None:
        self.groups: dict[bytes, dict[bytes, bytes | None]] = {}
        self.cut: set[bytes] = set()

    def __bool__(self) -> bool:
        return bool(self.groups or self.cut)

    def put(self, key: bytes, value: bytes | None) -> None:
        group = group_of(key)
        entries = self.groups.get(group)
        if entries is None:
            entries = self.groups[group] = {}
        entries[key] = value

    def drop(self, group: bytes) -> None:
        """Delete every key of ``group`` (a window of one kind)."""
        self.groups.pop(group, None)
        self.cut.add(group)

    def take(self, newer: Layer) -> None:
        """Apply ``newer``'s changes on top of this layer's."""
        for group in newer.cut:
            self.drop(group)
        for group, entries in newer.groups.items():
            mine = self.groups.get(group)
            if mine is None:
                self.groups[group] = dict(entries)
            else:
                mine.update(entries)


class DiskPart:
    """One partition's database, its stamp and its layers of unwritten changes."""

    __slots__ = ("counts", "db", "draining", "pending", "rocksdict", "stamp", "unflushed")

    def __init__(self, rocksdict: Any, db: Any, stamp: Stamp) -> None:
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only
        # window start -> its stage-1 partials, in the layers and on disk (None: not
        # counted since the database opened or took changelog records)
        self.counts: dict[int, int] | None = None
        self.rocksdict = rocksdict
        self.db = db
        self.stamp = stamp
        self.pending = Layer()
        self.draining = Layer()

    @classmethod
    def open(cls, rocksdict: Any, path: Path, want: Stamp, table: str, lock_tries: int) -> DiskPart:
        """The partition's database at ``path``: its own (same stamp), else a fresh one
        (one log line says why the one there is not used)."""
        db, found = open_database(
            rocksdict, path, want, owner=f"table {table!r}", lock_tries=lock_tries
        )
        return cls(rocksdict, db, want if found is None else found)

    # -- reads ----------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``: the newest layer's, else the disk's."""
        group = group_of(key)
        for layer in (self.pending, self.draining):
            entries = layer.groups.get(group)
            if entries is not None and key in entries:
                return entries[key]
            if group in layer.cut:
                return None
        value: bytes | None = self.db.get(key)
        return value

    def scan(self, prefix: bytes, begin: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every live key beginning with ``prefix`` (a kind, a window or
        a window's key), from ``begin`` on, in key order: the layers' changes over the
        disk's."""
        begin = max(begin, prefix)
        overlay: dict[bytes, bytes | None] = {}
        cuts: set[bytes] = set()
        for layer in (self.draining, self.pending):  # oldest first: the newer wins
            for group in layer.cut:  # a layer's cuts came before its puts
                if group.startswith(prefix) or prefix.startswith(group):
                    cuts.add(group)
                    overlay = {k: v for k, v in overlay.items() if not k.startswith(group)}
            for group, entries in layer.groups.items():
                if group.startswith(prefix) or prefix.startswith(group):
                    for key, value in entries.items():
                        if key.startswith(prefix) and key >= begin:
                            overlay[key] = value
        ours = sorted(overlay.items())
        on_disk = self._disk(prefix, begin, overlay, cuts)
        for key, value in heapq.merge(on_disk, ours, key=_first):
            if value is not None:
                yield key, value

    def _disk(
        self, prefix: bytes, begin: bytes, overlay: dict[bytes, bytes | None], cuts: set[bytes]
    ) -> Iterator[tuple[bytes, bytes | None]]:
        for key, value in self.db.items(from_key=begin):
            if not key.startswith(prefix):
                return
            if key in overlay or (cuts and group_of(key) in cuts):
                continue
            yield key, value

    def starts(self, kind: bytes) -> set[int]:
        """The window starts that hold keys of ``kind`` (a seek per start, no scan)."""
        found: set[int] = set()
        at = kind
        while True:
            first = next(self.scan(kind, at), None)
            if first is None:
                return found
            found.add(start_of(first[0]))
            at = _after(first[0][:9])

    def partials_held(self, starts: Iterable[int]) -> int:
        """How many stage-1 partials the windows ``starts`` hold: counted on disk the first
        time after the database opens or takes changelog records, then kept up to date."""
        counts = self.counts
        if counts is None:
            counts = self.counts = {}
            for key, _ in self.scan(PARTIAL):
                at = start_of(key)
                counts[at] = counts.get(at, 0) + 1
        return sum(counts.get(at, 0) for at in starts)

    def added_partials(self, start: int, n: int) -> None:
        """``n`` stage-1 partials of the window ``start`` are new (``put`` since)."""
        counts = self.counts
        if counts is not None and n:
            counts[start] = counts.get(start, 0) + n

    def forget_counts(self) -> None:
        """Changes not counted went in (a changelog's): count again when asked."""
        self.counts = None

    # -- writes ---------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes | None) -> None:
        """Set (or, with None, delete) ``key`` at the next persist after a drain."""
        self.pending.put(key, value)

    def drop(self, group: bytes) -> None:
        """Delete a whole window of one kind at the next persist after a drain."""
        self.pending.drop(group)
        if group[:1] == PARTIAL and self.counts is not None:
            self.counts.pop(start_of(group), None)

    def drain(self) -> None:
        """What changed so far goes with the changes drained for the changelog."""
        if self.pending:
            if self.draining:
                self.draining.take(self.pending)
            else:
                self.draining = self.pending
            self.pending = Layer()

    def persist(self, offset: int) -> None:
        """Write the drained changes, stamped with the changelog offset they reflect, in
        one atomic batch; then flush the database if its memtable holds much that is not
        on disk yet (``flowkit.state.memtables``)."""
        if self.draining or offset != self.stamp.offset:
            self._write(self.draining, offset)
            self.draining = Layer()
        flush_if_due(self.db, self.unflushed)

    def write_now(self, offset: int) -> None:
        """Write every change (a recovery's: nothing else touched the partition), with
        ``offset``."""
        self.drain()
        self.persist(offset)

    def _write(self, layer: Layer, offset: int) -> None:
        batch = self.rocksdict.WriteBatch(raw_mode=True)
        for group in layer.cut:
            batch.delete_range(group, _after(group))
        for entries in layer.groups.values():
            for key, value in entries.items():
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
        self.stamp = self.stamp.with_offset(max(offset, self.stamp.offset))
        batch.put(STAMP, self.stamp.encode())
        self.unflushed.wrote(batch.len())
        self.db.write(batch)

    def close(self) -> None:
        """Close the database."""
        self.db.close()


def _first(item: tuple[bytes, Any]) -> bytes:
    return item[0]
