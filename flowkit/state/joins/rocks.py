"""A stream-stream join's buffers on local disk, in RocksDB (the ``rocksdb://`` store).

One database per held partition, under ``<data_dir>/<app>/<join>/<partition>``, opened as a
plain table's are (``flowkit.state.rocks.open_database``: shared memtables and block cache,
the ``Stamp`` check, one log line and a rebuild for state that is not this partition's).
It holds what the join's changelog holds (``layout.py``: each record under its key and in
a time index), written in one atomic batch at each checkpoint with the changelog offset it
reflects (``b"\\x00stamp"``), so a restart replays only the changelog after it.

The join works on the database (``disk.py``): a record is matched by a range read of its
key, windows close and records expire by scans of the time index (``diskscans.py``); the
checkpoints are here (``drain_changes``, ``persist``, then ``_written``: the fresh records
leave memory). What stays in memory is
what changed since the last checkpoint, so memory does not grow with the records buffered.
"""

from __future__ import annotations

import shutil
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from heapq import heapify
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from ...records import Message
from ..databases import LOCK_TRIES, STAMP, open_database, write_checkpoint
from ..local import Stamp, partition_dir
from ..memtables import flush_if_due
from .disk import DiskJoinStore
from .diskpart import DISK, OUT, DiskJoinPart, stored_key
from .disktimes import BUCKETS
from .layout import (
    ENDS,
    MATCHED,
    RECORD,
    TIME,
    TOP,
    UNMATCHED,
    both_keys,
    record_key,
    record_prefix,
    side_prefix,
    side_start,
    time_key,
)
from .store import GONE, LEFT, LOGGED, NEVER, NONE, RIGHT, TIME_KEY, _state_decoder

if TYPE_CHECKING:
    from .declaration import StreamJoin

__all__ = ["RocksJoinStore", "record_key"]

log = structlog.get_logger(__name__)

_encode = msgspec.json.encode
_top_decoder = msgspec.json.Decoder(tuple[int, int])


class RocksJoinStore(DiskJoinStore):
    """A worker's state of one ``StreamJoin`` with its buffers on disk; the same join as
    ``JoinStore`` (which it is), with the local state a restart resumes from."""

    def __init__(
        self,
        join: StreamJoin,
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = LOCK_TRIES,
        buckets: int = BUCKETS,
    ) -> None:
        super().__init__(join, now_ms, buckets=buckets)
        self.data_dir = data_dir
        self.broker = broker
        self.lock_tries = lock_tries

    # -- local state ----------------------------------------------------------------------

    def stamp(self, partition: int) -> Stamp:
        """The stamp this worker's state of ``partition`` must carry."""
        return Stamp.of(self.join, partition, self.broker)

    def path(self, partition: int) -> Path:
        """The directory of ``partition``'s database."""
        return partition_dir(self.data_dir, self.join.app_name, self.join.name, partition)

    def assign(self, partitions: Iterable[int]) -> None:
        """Open the databases of these partitions (a fresh one where none is usable)."""
        for p in partitions:
            if p not in self.parts:
                self.parts[p] = self._open(p)

    def _open(self, p: int) -> DiskJoinPart:
        want = self.stamp(p)
        path = self.path(p)
        owner = f"join {self.join.name!r}"
        db, found = open_database(
            self._rocksdict, path, want, owner=owner, lock_tries=self.lock_tries
        )
        part = DiskJoinPart(p, db, want if found is None else found, self.buckets)
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
            part = DiskJoinPart(p, db, want, self.buckets)
        return part

    def _load(self, part: DiskJoinPart) -> None:
        # The stream time and offsets; the records stay on disk.
        time = part.db.get(TIME)
        if time is not None:
            state = _state_decoder.decode(time)
            if isinstance(state, int):
                state = (state, -1, -1)
            self._recover(part, {}, TIME_KEY, state)
        top = part.db.get(TOP)
        if top is not None:
            part.top = list(_top_decoder.decode(top))
        else:
            it = part.db.iter()
            it.seek(RECORD)
            earlier = it.valid() and it.key()[:1] == RECORD
            del it  # (an open iterator keeps the database open, and locked)
            if earlier:
                raise ValueError("its records have no time index (an earlier layout)")

    def local_offset(self, partition: int) -> int | None:
        """The changelog offset the local state of ``partition`` reflects, if any."""
        part = self.parts.get(partition)
        if part is None or part.stamp.offset < 0:
            return None
        return part.stamp.offset

    def reset(self, partition: int) -> None:
        """Forget the local state of ``partition`` (it is rebuilt from the changelog)."""
        self.revoke([partition])
        shutil.rmtree(self.path(partition), ignore_errors=True)
        self.assign([partition])

    def checkpoint(self, partition: int, dest: Path) -> None:
        """Write a copy of ``partition``'s database, as on disk now (stamp included), to
        ``dest``: RocksDB's checkpoint, hard links to the same files where it can."""
        write_checkpoint(self._rocksdict, self.parts[partition].db, dest)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        for p in partitions:
            part = self.parts.pop(p, None)
            if part is not None:
                part.forget_cursors()
                part.db.close()

    def aclose(self) -> None:
        """Close every database."""
        self.revoke(list(self.parts))

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Write changelog records to disk with the offset after the last of them, in one
        batch. A record's time never changes (it is its record's), so a record written
        again overwrites itself; a tombstone finds its record's time on disk."""
        messages = messages if isinstance(messages, Sequence) else list(messages)
        if not messages:
            return
        self.assign([partition])
        part = self.parts[partition]
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        written: dict[tuple[int, bytes, int], int | None] = {}  # in this batch: its time
        timed = False
        top = part.top
        for m in messages:
            parsed = self._parse(m)
            if parsed is None:
                continue
            ref, record = parsed
            if ref == TIME_KEY:
                if record is not None:
                    timed = True
                    self._recover(part, {}, TIME_KEY, record)
                continue
            side, key, offset = ref
            if record is None:
                ts = written[ref] if ref in written else self._time_on_disk(part, ref)
                if ts is not None:
                    batch.delete(record_key(side, key, ts, offset))
                    batch.delete(time_key(side, key, ts, offset))
                written[ref] = None
            else:
                ts, matched, raw = record
                flag = MATCHED if matched else UNMATCHED
                batch.put(record_key(side, key, ts, offset), flag + raw)
                batch.put(time_key(side, key, ts, offset), flag)
                written[ref] = ts
                if offset > top[side]:
                    top[side] = offset
        if timed:
            batch.put(TIME, _encode(part.logged))
        self._ends(batch, top)
        part.stamp = part.stamp.with_offset(messages[-1].offset + 1)
        batch.put(STAMP, part.stamp.encode())
        part.unflushed.wrote(batch.len())  # (flushed at the next checkpoint, if many)
        part.db.write(batch)
        part.forget_cursors()
        part.cut = [NONE, NONE]  # (what the scans took is settled again, after ``_start``)
        part.started = False  # the due times again, from what is on disk now

    @staticmethod
    def _time_on_disk(part: DiskJoinPart, ref: tuple[int, bytes, int]) -> int | None:
        side, key, offset = ref
        prefix = record_prefix(side, key)
        cut = len(prefix)
        it = part.db.iter()
        it.seek(prefix)
        while it.valid():
            stored = it.key()
            if stored[:cut] != prefix or len(stored) != cut + 16:
                break
            if int.from_bytes(stored[cut + 8 :], "big") - 2**63 == offset:
                return int.from_bytes(stored[cut : cut + 8], "big") - 2**63
            it.next()
        return None

    @staticmethod
    def _ends(batch: Any, top: list[int]) -> None:
        # The highest offsets, and the ends of both sides' records (``layout.ENDS``).
        batch.put(TOP, _encode(top))
        for end in ENDS:
            batch.put(end, b"")

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain (``JoinStore.drain_changes``); the same
        changes are written to disk at the next ``persist``."""
        for part in self.parts.values():
            encoded, evict = part.encoded, part.evict
            if not part.settle:
                # Every record an expiry scan took is settled (its tombstone is drained now
                # or was before): the time index below where the scans stopped can go whole.
                part.cut = list(part.expired)
            for entry in part.dirty:
                flags = entry[7]
                if flags & GONE:
                    if flags & LOGGED:
                        encoded.append((entry, None))
                    continue
                raw = entry[2]
                if raw is None:  # the changelog record carries the value: read back
                    raw = entry[2] = self._stored(part, entry)
                encoded.append((entry, (MATCHED if entry[1] else UNMATCHED) + raw))
                if not flags & DISK:
                    evict.append(entry)
        return super().drain_changes()

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, the stream time logged with it and the changelog offset
        it reflects, in one atomic batch per partition: called once the changelog holds it.
        Then flush the databases whose memtables hold much not on disk yet (``memtables``)."""
        for p, offset in offsets.items():
            part = self.parts.get(p)
            if part is None:
                continue
            if part.encoded or offset != part.stamp.offset:
                self._write(part, offset)
            flush_if_due(part.db, part.unflushed)

    def _write(self, part: DiskJoinPart, offset: int) -> None:
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        top, cut = part.top, part.cut
        for side in (LEFT, RIGHT):  # first: a record written below it again stays
            if cut[side] != NONE:
                batch.delete_range(side_start(side), side_prefix(side, cut[side]))
        put, delete = batch.put, batch.delete
        wrote = (part.on_disk[0].wrote, part.on_disk[1].wrote)
        for entry, value in part.encoded:  # in drain order: the latest last
            side, key, ts, offset_, stored = entry[6], entry[4], entry[0], entry[5], entry[8]
            if value is None:
                delete(stored or record_key(side, key, ts, offset_))
                if ts >= cut[side] or not entry[7] & DISK:  # (the range: scans' records)
                    delete(time_key(side, key, ts, offset_))
                continue
            if stored is None:
                stored, indexed = both_keys(side, key, ts, offset_)
            else:
                indexed = time_key(side, key, ts, offset_)
            put(stored, value)
            put(indexed, value[:1])
            wrote[side](key, ts)
            if offset_ > top[side]:
                top[side] = offset_
        batch.put(TIME, _encode(part.logged))
        self._ends(batch, top)
        part.stamp = part.stamp.with_offset(max(offset, part.stamp.offset))
        batch.put(STAMP, part.stamp.encode())
        part.unflushed.wrote(batch.len())
        part.db.write(batch)
        self._written(part)

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
