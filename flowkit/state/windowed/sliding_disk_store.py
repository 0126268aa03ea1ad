"""A sliding table's state in one worker on local disk (``rocksdb://``).

One RocksDB database per held partition, under ``<data_dir>/<app>/<table>/<partition>``
as the plain ``rocksdb://`` tables' (``flowkit.state.databases``, whose database handling,
shared memory budget and stamp it uses): the owner's records of each key, and the orders
in which its windows close and its records expire, live there (``sliding_disk_owner.py``);
stage 1 (each source partition's stream time, and its records on their way to their
owners until the next flush) and the owner's sources' watermarks are in memory while the
worker runs, as the memory store's, and written to the same database at each checkpoint,
as the changelog records them. Each database carries the changelog offset it reflects,
written in the same atomic batch, so a restart reads it and replays only the changelog
after that offset; local state that is not this partition's (another app, table, window
kind, partition count or broker, no offset, or a database that does not open) is rebuilt
from the changelog with one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import DecodeError
from ...records import Message
from ..databases import LOCK_TRIES, open_rocksdict
from . import sliding_disk, wire
from .disk_partitions import PartitionDatabases
from .sliding_disk import MIRROR, SlidingDisk
from .sliding_disk_owner import DiskRecords, DiskSlidingOwners
from .sliding_owner import SlidingOwners
from .sliding_source import SlidingPart, SlidingSource
from .sliding_store import SlidingStore

if TYPE_CHECKING:
    from .sliding_table import SlidingTable

__all__ = ["DiskSlidingStore"]

_RECORD_KEY = b'["R",'  # the changelog keys of an owner's records: on disk as they change


class DiskSlidingStore(PartitionDatabases, SlidingStore):
    """Stream times and watermarks in memory, the owners' records on disk, both recovered
    from a database per partition and the changelog's tail."""

    disk_format = sliding_disk.FORMAT

    def __init__(
        self,
        table: SlidingTable[Any, Any],
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = LOCK_TRIES,
    ) -> None:
        super().__init__(table, now_ms)
        self.owners: DiskSlidingOwners = DiskSlidingOwners(
            self.owners.spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,
            updates=table.emit_on == "update",
        )
        self.data_dir = data_dir
        self.broker = broker
        self.lock_tries = lock_tries
        self._rocksdict = open_rocksdict()
        self._disks: dict[int, SlidingDisk] = {}

    # -- partitions -----------------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Open these partitions' databases and load what is kept in memory."""
        for p in partitions:
            if p in self._disks:
                continue
            disk = SlidingDisk.open(
                self._rocksdict, self.path(p), self.stamp(p), self.table.name, self.lock_tries
            )
            self._disks[p] = disk
            SlidingSource.assign(self, [p])
            self.owners.attach(p, disk)
            self._load(p, disk)

    def _load(self, p: int, disk: SlidingDisk) -> None:
        # The records of the in-memory state, as the changelog had them at the stamp's
        # offset (each the whole state of its key: their order does not matter).
        part, owner = self.parts[p], self.owners.owners[p]
        shapes, sources = self.changelog_shapes, self.partitions
        for key, value in disk.items(MIRROR):
            try:
                kind, parts, v = wire.decode_change(key[1:], value, shapes, sources)
            except DecodeError:
                continue  # (written by this class from records it had checked)
            if kind in self.stage1_kinds:
                SlidingSource.apply_record(self, part, kind, parts, v)
            else:
                SlidingOwners.apply_record(self.owners, owner, kind, parts, v)
        self.owners.recovered(owner, p)
        self.recovered(part)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        ps = list(partitions)
        super().revoke(ps)
        self.close_disks(ps)

    def keys_held(self, partition: int) -> int:
        """Keys whose records owner partition ``partition`` holds here (for metrics:
        counted as they come and go, not read)."""
        owner = self.owners.owners.get(partition)
        return 0 if owner is None else len(owner.records)

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild ``partition`` from changelog records, written to disk with the offset
        after the last of them."""
        messages = list(messages)
        super().apply_changelog(partition, messages)
        if messages:
            self._flush(partition)
            self._disks[partition].write_now(messages[-1].offset + 1)

    def apply_record(self, part: SlidingPart, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1, in memory and on disk."""
        super().apply_record(part, kind, parts, value)
        encoded = None if value is None else wire.encode(value)
        self._disks[part.number].put(MIRROR + wire.encode(parts), encoded)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain; the same changes go to disk at the
        next ``persist``."""
        records = super().drain_changes()
        disks = self._disks
        for p, key, value in records:
            if not key.startswith(_RECORD_KEY):
                disks[p].put(MIRROR + key, value)
        for p, disk in disks.items():
            self._flush(p)
            disk.drain()
        return records

    def _flush(self, p: int) -> None:
        owner = self.owners.owners.get(p)
        if owner is not None:
            records = owner.records
            assert isinstance(records, DiskRecords)
            records.flush()

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, with the changelog offset it reflects, in one atomic
        batch per partition: called once the changelog holds it."""
        for p, offset in offsets.items():
            disk = self._disks.get(p)
            if disk is not None:
                disk.persist(offset)
