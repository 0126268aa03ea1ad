"""A partitioned table's state on local disk, in RocksDB (through ``rocksdict``).

One database per held partition, under ``<data_dir>/<app>/<table>/<partition>``. It holds
the changelog's content (encoded keys and values, as the changelog has them) and, under
one reserved key, the partition's ``Stamp``: the changelog offset the data reflects. Both
are written in one atomic batch at each checkpoint, after the changelog writes were
acknowledged, so the database never runs ahead of the changelog; a restart replays only
the changelog after that offset. A checkpoint also flushes a database whose memtable holds
much that is not on disk yet (``flowkit.state.memtables``): what a restart after a crash
replays from RocksDB's write-ahead log stays small.

Between checkpoints, changes live in memory (``pending``, then ``draining`` while a
checkpoint sends them); reads look there first, then in a bounded cache of recent values,
then on disk. ``table[key] += 1`` costs a dict lookup when the key is hot.

``rocksdict`` is an optional extra (``pip install "flowkit[rocksdb]"``), imported only when
a table asks for this store.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog

from ..errors import DecodeError, NotRunningError
from ..records import Message
from ..streamtime import FutureGuard
from .databases import LOCK_TRIES, STAMP, open_database, open_rocksdict, write_checkpoint
from .local import Stamp, partition_dir
from .memtables import Unflushed, flush_if_due
from .refusals import keyless
from .stores import Change, TimedChange

if TYPE_CHECKING:
    from .tables import Table

__all__ = ["RocksTableStore"]

log = structlog.get_logger(__name__)

K = TypeVar("K")
V = TypeVar("V")

CLOCK = b"\x00clock"  # a table with ttl=: the partition's stream time (8 bytes)
DATA = b"d"
# A table with ttl=: each value is prefixed with its write time (8 bytes, ms), and
# b"e" + due time (8 bytes, big-endian: they sort by time) + key is its expiry index.
DUE = b"e"
_GONE: Any = object()  # a deleted key, in the in-memory layers
_OPENERS = 8  # databases opened at once
_CACHE = 50_000  # recent values kept per partition: a hot key is read from disk once


class _Part:
    """One partition: its database and the changes not yet written to it."""

    __slots__ = (
        "cache",
        "clock",
        "db",
        "draining",
        "dropped",
        "due",
        "encoded",
        "pending",
        "stamp",
        "times",
        "unflushed",
    )

    def __init__(self, db: Any, stamp: Stamp, clock: int = 0) -> None:
        self.db = db
        self.stamp = stamp
        self.pending: dict[Any, Any] = {}  # changed since the last drain
        self.draining: dict[Any, Any] = {}  # drained, not yet on disk
        self.encoded: list[tuple[bytes, bytes | None]] = []  # the same, as stored
        self.cache: dict[Any, Any] = {}  # read or written recently (bounded)
        # A table with ttl=: write times since the last drain, the stream time, and the
        # expiry index's entries to add and to delete at the next persist.
        self.times: dict[Any, int] = {}
        self.clock = clock
        self.due: list[bytes] = []
        self.dropped: list[bytes] = []
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only


class _Writer(Generic[K, V]):
    """What ``TableStore.writable`` returns on this store: sets and deletes of one partition."""

    __slots__ = ("part", "store")

    def __init__(self, store: RocksTableStore[K, V], part: _Part) -> None:
        self.store = store
        self.part = part

    def __setitem__(self, key: K, value: V) -> None:
        self.part.pending[key] = value

    def __delitem__(self, key: K) -> None:
        if self.store.lookup(self.part, key) is _GONE:
            raise KeyError(key)
        self.part.pending[key] = _GONE


class RocksTableStore(Generic[K, V]):
    """A partitioned table's state in one worker, on disk; read like ``TableStore``."""

    def __init__(
        self,
        table: Table[K, V],
        *,
        data_dir: Path,
        broker: str,
        now_ms: Callable[[], int] = lambda: 0,
        lock_tries: int = LOCK_TRIES,
    ) -> None:
        self.rejected: list[tuple[Message, Exception]] = []
        self.table = table
        self.data_dir = data_dir
        self.broker = broker
        self.lock_tries = lock_tries  # 0.1 s apart: how long a database held elsewhere is awaited
        self._rocksdict = open_rocksdict()
        self._parts: dict[int, _Part] = {}
        # Key expiry (a table with ttl=; see ``flowkit.state.expiry``).
        self.ttl: int | None = table.ttl_ms
        self.wall = table.ttl_clock == "wall"
        self.now_ms = now_ms
        self.guard = FutureGuard(table.max_future_ms, now_ms=now_ms, owner=f"table {table.name!r}")
        self.expired = 0
        self._skip = 0 if self.ttl is None else 8  # the write time before each value

    # -- reads ----------------------------------------------------------------------------

    def lookup(self, part: _Part, key: Any) -> Any:
        """``key``'s value in ``part``: its latest change (pending, then being written),
        else the disk's through the cache; the ``_GONE`` marker if it has none."""
        value = part.pending.get(key, _GONE)
        if value is not _GONE or key in part.pending:
            return value
        value = part.draining.get(key, _GONE)
        if value is not _GONE or key in part.draining:
            return value
        value = part.cache.get(key, _GONE)
        if value is not _GONE or key in part.cache:
            return value
        raw = part.db.get(DATA + self.table.encode_key(key))
        skip = self._skip
        value = _GONE if raw is None else self.table.value_codec.decode(raw[skip:] if skip else raw)
        cache = part.cache
        if len(cache) >= _CACHE:
            cache.clear()
        cache[key] = value
        return value

    def __getitem__(self, key: K) -> V:
        part = self._parts.get(self.table.partition_of(key))
        if part is not None:
            value = self.lookup(part, key)
            if value is not _GONE:
                return value  # type: ignore[no-any-return]
        default = self.table.default
        if default is None:
            raise KeyError(key)
        return default()

    def __contains__(self, key: object) -> bool:
        part = self._parts.get(self.table.partition_of(key))  # type: ignore[arg-type]
        return part is not None and self.lookup(part, key) is not _GONE

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default`` (the table's default is not used)."""
        part = self._parts.get(self.table.partition_of(key))
        if part is None:
            return default
        value = self.lookup(part, key)
        return default if value is _GONE else value

    def _partition_items(self, part: _Part) -> Iterator[tuple[K, V]]:
        overlay = {**part.draining, **part.pending}
        decode_key = self.table.key_codec.decode
        decode = self.table.value_codec.decode
        skip = self._skip
        for raw_key, raw in part.db.items(from_key=DATA):
            if raw_key[:1] != DATA:
                break  # the expiry index, after the data
            key = decode_key(raw_key[1:])
            if key not in overlay:
                yield key, decode(raw[skip:])
        for key, value in overlay.items():
            if value is not _GONE:
                yield key, value

    def __iter__(self) -> Iterator[K]:
        for key, _ in self.items():
            yield key

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def items(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs of the partitions this worker holds (read from disk)."""
        for part in list(self._parts.values()):
            yield from self._partition_items(part)

    # -- writes ---------------------------------------------------------------------------

    def writable(self, partition: int, key: K) -> _Writer[K, V]:
        """Where ``table[key] = value`` of ``partition`` goes (to disk and the changelog
        at the next checkpoint)."""
        part = self._parts.get(partition)
        if part is None:
            raise NotRunningError(
                f"table {self.table.name!r}: partition {partition} is not assigned to this worker"
            )
        return _Writer(self, part)

    # -- the worker's side ----------------------------------------------------------------

    def stamp(self, partition: int) -> Stamp:
        """The stamp this worker's state of ``partition`` must carry."""
        return Stamp.of(self.table, partition, self.broker, timed=self.ttl is not None)

    def touch(self, partition: int, key: K, ms: int | None) -> None:
        """``key`` of ``partition`` was written at event time ``ms`` (None: at the
        partition's stream time), for a table whose keys expire."""
        part = self._parts[partition]
        if ms is None:  # no stream time yet (no record read): the wall clock's
            ms = part.clock or self.now_ms()
        elif ms > part.clock:
            part.clock = ms
        part.times[key] = ms

    def advance(self, partition: int, ms: int) -> None:
        """Move the stream time of ``partition`` to ``ms`` (it never moves back)."""
        part = self._parts.get(partition)
        if part is not None and ms > part.clock:
            part.clock = ms

    def assign(self, partitions: Iterable[int]) -> None:
        """Open the databases of these partitions (a fresh one where none is usable), side
        by side: RocksDB opens one (and replays its write-ahead log after a crash) without
        holding the GIL, and most of an open is waiting for the disk."""
        fresh = [p for p in dict.fromkeys(partitions) if p not in self._parts]
        if len(fresh) < 2:
            for p in fresh:
                self._parts[p] = self._open(p)
            return
        with ThreadPoolExecutor(min(len(fresh), _OPENERS), "flowkit-rocksdb-open") as pool:
            opening = [pool.submit(self._open, p) for p in fresh]
        failed = [e for f in opening if (e := f.exception()) is not None]
        for p, f in zip(fresh, opening, strict=True):
            if f.exception() is None:
                self._parts[p] = f.result()
        if failed:
            raise failed[0]  # (those that opened are held: a revocation closes them)

    def _open(self, p: int) -> _Part:
        want = self.stamp(p)
        db, found = open_database(
            self._rocksdict,
            self.path(p),
            want,
            owner=f"table {self.table.name!r}",
            lock_tries=self.lock_tries,
        )
        if found is None:
            return _Part(db, want)
        clock = db.get(CLOCK)
        return _Part(db, found, 0 if clock is None else _int(clock))

    def local_offset(self, partition: int) -> int | None:
        """The changelog offset the local state of ``partition`` reflects, if any."""
        part = self._parts.get(partition)
        if part is None or part.stamp.offset < 0:
            return None
        return part.stamp.offset

    def reset(self, partition: int) -> None:
        """Forget the local state of ``partition`` (it is rebuilt from the changelog)."""
        part = self._parts.pop(partition, None)
        if part is not None:
            part.db.close()
        path = self.path(partition)
        shutil.rmtree(path, ignore_errors=True)
        self.assign([partition])

    def path(self, partition: int) -> Path:
        """The directory of ``partition``'s database."""
        return partition_dir(self.data_dir, self.table.app_name, self.table.name, partition)

    def replace(self, partition: int, source: Path) -> None:
        """Make the closed database at ``source`` (a standby copy, stamped for this
        partition) the state of ``partition``: moved, not copied; opened as on assignment."""
        part = self._parts.pop(partition, None)
        if part is not None:
            part.db.close()
        path = self.path(partition)
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        source.rename(path)
        self.assign([partition])

    def checkpoint(self, partition: int, dest: Path) -> None:
        """Write a copy of ``partition``'s database, as on disk now (stamp included), to
        ``dest``: RocksDB's checkpoint, hard links to the same files where it can."""
        write_checkpoint(self._rocksdict, self._parts[partition].db, dest)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        for p in partitions:
            part = self._parts.pop(p, None)
            if part is not None:
                part.db.close()

    def aclose(self) -> None:
        """Close every database."""
        self.revoke(list(self._parts))

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self._parts)

    def sizes(self) -> dict[int, int]:
        """Keys per held partition, as RocksDB estimates them (no scan)."""
        # With ttl= each key has an entry in the expiry index beside it: about half are keys.
        share = 1 if self.ttl is None else 2
        return {
            p: int(part.db.property_int_value("rocksdb.estimate-num-keys") or 0) // share
            for p, part in list(self._parts.items())
        }

    def apply_changelog(self, partition: int, messages: Sequence[Message]) -> None:
        """Write changelog records to disk with the offset after the last of them, in one
        batch (None value = deleted); a record that does not decode goes to ``rejected``."""
        if not messages:
            return
        part = self._parts.get(partition)
        if part is None:
            self.assign([partition])
            part = self._parts[partition]
        key_decode = self.table.key_codec.decode
        decode = self.table.value_codec.decode
        encode_key = self.table.encode_key
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        ttl = self.ttl
        guard = self.guard
        for m in messages:
            if m.key is None:
                self.rejected.append((m, keyless()))
                continue
            try:
                # The key as this worker encodes it: lookups encode the same way.
                key = encode_key(key_decode(m.key))
                if m.value is None:
                    batch.delete(DATA + key)
                else:
                    decode(m.value)  # refused here, not at a later read
                    if ttl is None:
                        batch.put(DATA + key, m.value)
                    else:  # the record's timestamp is the key's write time
                        at = int(m.timestamp)
                        batch.put(DATA + key, _bytes(at) + m.value)
                        batch.put(DUE + _bytes(at + ttl) + key, b"")
            except DecodeError as exc:
                self.rejected.append((m, exc))
                continue
            except TypeError as exc:
                self.rejected.append((m, DecodeError(f"a changelog key is no table key: {exc}")))
                continue
            at = int(m.timestamp)
            # A timestamp beyond the guard (anyone may write the topic) moves nothing.
            moves = ttl is not None and not self.wall and at > part.clock
            if moves and (at <= guard.future_limit or guard.admits(at)):
                part.clock = at
        part.stamp = part.stamp.with_offset(messages[-1].offset + 1)
        batch.put(STAMP, part.stamp.encode())
        if ttl is not None:
            batch.put(CLOCK, _bytes(part.clock))
        part.unflushed.wrote(batch.len())  # (a recovery's: flushed at the next checkpoint)
        part.db.write(batch)
        part.cache.clear()

    def drain_changes(self) -> list[Any]:
        """The latest value of every key changed since the last drain: (partition, key,
        value or None for a delete), with the write time (``TimedChange``) when keys
        expire; those keys whose time is up are deleted and drained as deletes too."""
        if self.ttl is not None:
            return self._drain_timed(self.ttl)
        out: list[Change] = []
        encode = self.table.value_codec.encode
        encode_key = self.table.encode_key
        for p, part in self._parts.items():
            if not part.pending:
                continue
            encoded = part.encoded
            for key, value in part.pending.items():
                record = (encode_key(key), None if value is _GONE else encode(value))
                encoded.append(record)
                out.append((p, *record))
            part.draining.update(part.pending)
            part.pending = {}
        return out

    def _drain_timed(self, ttl: int) -> list[TimedChange]:
        out: list[TimedChange] = []
        encode = self.table.value_codec.encode
        encode_key = self.table.encode_key
        wall = self.now_ms() if self.wall else None
        for p, part in self._parts.items():
            now = part.clock if wall is None else wall
            self._sweep(part, ttl, now)
            if not part.pending:
                continue
            encoded, times = part.encoded, part.times
            for key, value in part.pending.items():
                kb = encode_key(key)
                at = wall if wall is not None else times.get(key, now)
                if value is not _GONE and at + ttl <= now:
                    value = part.pending[key] = _GONE  # written already expired (late)
                    self.expired += 1
                if value is _GONE:
                    encoded.append((kb, None))
                    out.append((p, kb, None, now))
                    continue
                vb = encode(value)
                encoded.append((kb, _bytes(at) + vb))
                part.due.append(DUE + _bytes(at + ttl) + kb)
                out.append((p, kb, vb, at))
            part.times = {}
            part.draining.update(part.pending)
            part.pending = {}
        return out

    def _sweep(self, part: _Part, ttl: int, now: int) -> None:
        """Mark the keys whose time is up as deleted: only the index's entries due by
        ``now`` are read, each once (they are deleted at the next persist)."""
        key_decode = self.table.key_codec.decode
        end = DUE + _bytes(now + 1)
        pending, draining, db = part.pending, part.draining, part.db
        for index_key, _ in db.items(from_key=DUE):
            if index_key >= end:
                break
            part.dropped.append(index_key)
            due, kb = _int(index_key[1:9]), index_key[9:]
            key = key_decode(kb)
            if key in pending or key in draining:
                continue  # written or deleted since: its own entry is to come
            raw = db.get(DATA + kb)
            if raw is None or _int(raw[:8]) + ttl != due:
                continue  # a stale entry: deleted, or written again since
            pending[key] = _GONE
            self.expired += 1

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, with the changelog offset it reflects, in one atomic
        batch per partition: called once the changelog holds it. Then flush the
        databases whose memtables hold much that is not on disk yet."""
        for p, offset in offsets.items():
            part = self._parts.get(p)
            if part is None:
                continue
            if part.draining or part.dropped or offset != part.stamp.offset:
                self._write(part, offset)
            flush_if_due(part.db, part.unflushed)

    def _write(self, part: _Part, offset: int) -> None:
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        if self.ttl is not None:
            for index_key in part.dropped:
                batch.delete(index_key)
            for index_key in part.due:
                batch.put(index_key, b"")
            part.dropped, part.due = [], []
            batch.put(CLOCK, _bytes(part.clock))
        for key, value in part.encoded:  # in drain order: the latest value last
            if value is None:
                batch.delete(DATA + key)
            else:
                batch.put(DATA + key, value)
        part.encoded = []
        part.stamp = part.stamp.with_offset(max(offset, part.stamp.offset))
        batch.put(STAMP, part.stamp.encode())
        part.unflushed.wrote(batch.len())
        part.db.write(batch)
        cache = part.cache
        if len(cache) + len(part.draining) > _CACHE:
            cache.clear()
        cache.update(part.draining)
        part.draining = {}


def _bytes(ms: int) -> bytes:
    # Big-endian and offset by 2**63: every int64 time sorts in byte order. A time past
    # the int64 range (a write time near its end, anyone may write the changelog, plus
    # the ttl) is its end: that key is due never, rather than a store that cannot open.
    return (min(max(ms, -(2**63)), 2**63 - 1) + 2**63).to_bytes(8, "big")


def _int(raw: bytes) -> int:
    return int.from_bytes(raw[:8], "big") - 2**63
