"""A stream-stream join's buffers on local disk, in RocksDB (the ``rocksdb://`` store).

One database per held partition, under ``<data_dir>/<app>/<join>/<partition>``, opened as a
plain table's are (``flowkit.state.rocks.open_database``: shared memtables and block cache,
the ``Stamp`` check, one log line and a rebuild for state that is not this partition's).
It holds what the join's changelog holds, written in one atomic batch at each checkpoint
with the changelog offset it reflects, so a restart replays only the changelog after it:

* ``b"\\x00stamp"``: the ``Stamp`` (the changelog offset);
* ``b"\\x00time"``: the stream time and the offsets of the last records done, as the
  changelog's ``["t"]`` record;
* ``b"r"`` + side (1 byte) + key length (4 bytes) + key + timestamp (8 bytes) + offset
  (8 bytes), big-endian (times and offsets shifted by 2**63, so that they sort in byte
  order), -> matched (1 byte) + the record's value as read. A key's records of one side
  sit together in timestamp order, so the records of a key within a window are one range
  of keys.

The values are on disk; what stays in memory is each buffered record's *entry* (its
timestamp, key, offset and flags: the join's index, in timestamp order for closing and
expiry, as on the memory store), so matching a key and expiring records cost no disk
read. A value is read from disk when its record matches or comes out unmatched; the values
of the records written since the last checkpoint stay in memory until it has written them.
Expired records are deleted at the checkpoint that tells the changelog: one delete each
in its batch. Expiry needs no index of its own on disk, since the entries in memory are in
timestamp order.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from ...records import Message
from ..local import Stamp, partition_dir
from ..rocks import _LOCK_TRIES, STAMP, _bytes, open_database, open_rocksdict
from .store import GONE, LOGGED, TIME_KEY, JoinPart, JoinStore, _state_decoder

if TYPE_CHECKING:
    from .declaration import StreamJoin

__all__ = ["RocksJoinStore", "record_key"]

log = structlog.get_logger(__name__)

TIME = b"\x00time"
RECORD = b"r"
_encode = msgspec.json.encode
_MATCHED, _UNMATCHED = b"\x01", b"\x00"


def record_key(side: int, key: bytes, ts: int, offset: int) -> bytes:
    """Where a buffered record is stored: side, key, then time, so that one key's
    records of one side are one range in time order.

    >>> record_key(0, b"k", 0, 1)[:7]
    b'r\\x00\\x00\\x00\\x00\\x01k'
    >>> record_key(1, b"k", 5, 0) < record_key(1, b"k", 6, 0) < record_key(1, b"kk", 0, 0)
    True
    """
    return b"".join(
        (RECORD, bytes((side,)), len(key).to_bytes(4, "big"), key, _bytes(ts), _bytes(offset))
    )


def _entry_of(stored_key: bytes, value: bytes) -> list[Any]:
    """The entry (see ``JoinPart``) of a stored record, without its value (on disk)."""
    side = stored_key[1]
    size = int.from_bytes(stored_key[2:6], "big")
    key = stored_key[6 : 6 + size]
    ts = int.from_bytes(stored_key[6 + size : 14 + size], "big") - 2**63
    offset = int.from_bytes(stored_key[14 + size : 22 + size], "big") - 2**63
    return [ts, value[:1] == _MATCHED, None, None, key, offset, side, LOGGED]


def _stored_key(entry: list[Any]) -> bytes:
    return record_key(entry[6], entry[4], entry[0], entry[5])


class RocksJoinPart(JoinPart):
    """The buffers of one partition, with its database."""

    __slots__ = ("db", "encoded", "evict", "stamp")

    def __init__(self, number: int, db: Any, stamp: Stamp) -> None:
        super().__init__(number)
        self.db = db
        self.stamp = stamp
        # Drained to the changelog, written to disk at the next persist: (stored key,
        # value or None), in drain order; and the entries whose values may then leave memory.
        self.encoded: list[tuple[bytes, bytes | None]] = []
        self.evict: list[list[Any]] = []


class RocksJoinStore(JoinStore):
    """A worker's state of one ``StreamJoin`` with its buffers on disk; the same join as
    ``JoinStore`` (which it is), with the local state a restart resumes from."""

    parts: dict[int, RocksJoinPart]  # type: ignore[assignment]

    def __init__(
        self,
        join: StreamJoin,
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = _LOCK_TRIES,
    ) -> None:
        super().__init__(join, now_ms)
        self.table = join  # what the worker's state keeper calls a store's declaration
        self.data_dir = data_dir
        self.broker = broker
        self.lock_tries = lock_tries
        self._rocksdict = open_rocksdict()

    # -- the join's reads -----------------------------------------------------------------

    def _value(self, part: JoinPart, entry: list[Any]) -> Any:
        raw = entry[2]
        if raw is not None:
            return super()._value(part, entry)
        # On disk only: read and decoded for this use, not kept (memory stays bounded by
        # the index).
        assert isinstance(part, RocksJoinPart)
        return self._decode[entry[6]](self._stored(part, entry))

    def _stored(self, part: RocksJoinPart, entry: list[Any]) -> bytes:
        stored = part.db.get(_stored_key(entry))
        if stored is None:
            raise RuntimeError(
                f"join {self.join.name!r}: a buffered record of partition {part.number} is "
                f"missing from its local state ({self.path(part.number)})"
            )
        return bytes(stored[1:])

    # -- local state ----------------------------------------------------------------------

    def stamp(self, partition: int) -> Stamp:
        """The stamp this worker's state of ``partition`` must carry."""
        return Stamp.of(self.join, partition, self.broker)

    def path(self, partition: int) -> Path:
        """The directory of ``partition``'s database."""
        return partition_dir(self.data_dir, self.join.app_name, self.join.name, partition)

    def assign(self, partitions: Iterable[int]) -> None:
        """Open the databases of these partitions (a fresh one where none is usable);
        what one holds is made into the buffers when the partition is first used."""
        for p in partitions:
            if p not in self.parts:
                self.parts[p] = self._open(p)

    def _open(self, p: int) -> RocksJoinPart:
        want = self.stamp(p)
        path = self.path(p)
        owner = f"join {self.join.name!r}"
        db, found = open_database(
            self._rocksdict, path, want, owner=owner, lock_tries=self.lock_tries
        )
        part = RocksJoinPart(p, db, want if found is None else found)
        if found is None:
            return part
        try:
            self._load(part)
        except Exception as exc:  # stamped, but what it holds does not read
            log.warning(
                "local state not used; rebuilding from the changelog",
                table=self.join.name,
                partition=p,
                path=str(path),
                reason=f"it does not read ({exc})",
            )
            db.close()
            shutil.rmtree(path, ignore_errors=True)
            db, _ = open_database(self._rocksdict, path, want, owner=owner, lock_tries=1)
            part = RocksJoinPart(p, db, want)
        return part

    def _load(self, part: RocksJoinPart) -> None:
        # The buffers as the database holds them, made when the partition is first used.
        recovered: dict[tuple[int, bytes, int], list[Any]] = {}
        time = part.db.get(TIME)
        if time is not None:
            state = _state_decoder.decode(time)
            if isinstance(state, int):
                state = (state, -1, -1)
            self._recover(part, recovered, TIME_KEY, state)
        for stored_key, value in part.db.items(from_key=RECORD):
            if stored_key[:1] != RECORD:
                break
            e = _entry_of(stored_key, value)
            recovered[(e[6], e[4], e[5])] = e
        part.recovered = recovered

    def local_offset(self, partition: int) -> int | None:
        """The changelog offset the local state of ``partition`` reflects, if any."""
        part = self.parts.get(partition)
        if part is None or part.stamp.offset < 0:
            return None
        return part.stamp.offset

    def reset(self, partition: int) -> None:
        """Forget the local state of ``partition`` (it is rebuilt from the changelog)."""
        part = self.parts.pop(partition, None)
        if part is not None:
            part.db.close()
        shutil.rmtree(self.path(partition), ignore_errors=True)
        self.assign([partition])

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        for p in partitions:
            part = self.parts.pop(p, None)
            if part is not None:
                part.db.close()

    def aclose(self) -> None:
        """Close every database."""
        self.revoke(list(self.parts))

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Write changelog records to disk with the offset after the last of them, in one
        batch, and to the buffers being recovered (without their values: on disk)."""
        messages = messages if isinstance(messages, Sequence) else list(messages)
        if not messages:
            return
        self.assign([partition])
        part = self.parts[partition]
        found = self._recovering(part)
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        timed = False
        for m in messages:
            parsed = self._parse(m)
            if parsed is None:
                continue
            ref, record = parsed
            if ref == TIME_KEY:
                timed = True
            else:
                old = found.get(ref)
                if old is not None:
                    batch.delete(_stored_key(old))
                if record is not None:
                    ts, matched, raw = record
                    flag = _MATCHED if matched else _UNMATCHED
                    batch.put(record_key(ref[0], ref[1], ts, ref[2]), flag + raw)
            self._recover(part, found, ref, record)
            if record is not None and ref != TIME_KEY:
                found[ref][2] = None  # the value is on disk
        if timed:
            batch.put(TIME, _encode(part.logged))
        part.stamp = part.stamp.with_offset(messages[-1].offset + 1)
        batch.put(STAMP, part.stamp.encode())
        part.db.write(batch)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain (``JoinStore.drain_changes``); the same
        changes are written to disk at the next ``persist``."""
        for part in self.parts.values():
            if part.recovered is not None:
                self._rebuild(part)
            encoded, evict = part.encoded, part.evict
            for entry in part.dirty:
                flags = entry[7]
                if flags & GONE:
                    if flags & LOGGED:
                        encoded.append((_stored_key(entry), None))
                    continue
                raw = entry[2]
                if raw is None:  # the changelog record carries the value: read back
                    raw = entry[2] = self._stored(part, entry)
                flag = _MATCHED if entry[1] else _UNMATCHED
                encoded.append((_stored_key(entry), flag + raw))
                evict.append(entry)
        return super().drain_changes()

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, the stream time logged with it and the changelog offset
        it reflects, in one atomic batch per partition: called once the changelog holds it."""
        for p, offset in offsets.items():
            part = self.parts.get(p)
            if part is None or (not part.encoded and offset == part.stamp.offset):
                continue
            batch = self._rocksdict.WriteBatch(raw_mode=True)
            for stored_key, value in part.encoded:  # in drain order: the latest last
                if value is None:
                    batch.delete(stored_key)
                else:
                    batch.put(stored_key, value)
            batch.put(TIME, _encode(part.logged))
            part.stamp = part.stamp.with_offset(max(offset, part.stamp.offset))
            batch.put(STAMP, part.stamp.encode())
            part.db.write(batch)
            for entry in part.evict:  # on disk now: read from there when needed
                entry[2] = entry[3] = None
            part.encoded, part.evict = [], []
