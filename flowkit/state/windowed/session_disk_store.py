"""A session table's state in one worker on local disk (``rocksdb://``).

One RocksDB database per held partition, under ``<data_dir>/<app>/<table>/<partition>``
as the plain ``rocksdb://`` tables' (``flowkit.state.databases``, whose database handling,
shared memory budget and stamp it uses): the owner's closed sessions live there
(``session_disk_owner.py``); stage 1, the source partition's open sessions, and the
sessions an owner holds open for its other sources, are in memory while the worker runs,
as the memory store's, and written to the same database at each checkpoint, as the
changelog records them. Each database carries the changelog offset it reflects, written
in the same atomic batch, so a restart reads it and replays only the changelog after that
offset; local state that is not this partition's (another app, table, window kind,
partition count or broker, no offset, or a database that does not open) is rebuilt from
the changelog with one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import DecodeError
from ...records import Message
from ..databases import LOCK_TRIES, open_rocksdict
from . import session_disk, wire
from .disk_partitions import PartitionDatabases
from .session_disk import MIRROR, SessionDisk
from .session_disk_owner import DiskSessionOwners
from .session_owner import SessionOwners
from .session_source import SessionPart, SessionSource
from .session_store import SessionStore

if TYPE_CHECKING:
    from .session_table import SessionTable

__all__ = ["DiskSessionStore"]

_CLOSED_KEY = b'["C",'  # the changelog keys of closed sessions: on disk as they happen


class DiskSessionStore(PartitionDatabases, SessionStore):
    """Open sessions in memory, closed ones on disk, both recovered from a database per
    partition and the changelog's tail."""

    disk_format = session_disk.FORMAT

    def __init__(
        self,
        table: SessionTable[Any, Any],
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = LOCK_TRIES,
    ) -> None:
        super().__init__(table, now_ms)
        self.owners: DiskSessionOwners = DiskSessionOwners(
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
        self._disks: dict[int, SessionDisk] = {}

    # -- partitions -----------------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Open these partitions' databases and load what is kept in memory."""
        for p in partitions:
            if p in self._disks:
                continue
            disk = SessionDisk.open(
                self._rocksdict, self.path(p), self.stamp(p), self.table.name, self.lock_tries
            )
            self._disks[p] = disk
            SessionSource.assign(self, [p])
            self.owners.attach(p, disk)
            self._load(p, disk)

    def _load(self, p: int, disk: SessionDisk) -> None:
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
                SessionSource.apply_record(self, part, kind, parts, v)
            else:
                SessionOwners.apply_record(self.owners, owner, kind, parts, v)
        self.owners.recovered(owner, p)
        self.recovered(part)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        ps = list(partitions)
        super().revoke(ps)
        self.close_disks(ps)

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild ``partition`` from changelog records, written to disk with the offset
        after the last of them."""
        messages = list(messages)
        super().apply_changelog(partition, messages)
        if messages:
            self._disks[partition].write_now(messages[-1].offset + 1)

    def apply_record(self, part: SessionPart, kind: str, parts: list[Any], value: Any) -> None:
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
            if not key.startswith(_CLOSED_KEY):
                disks[p].put(MIRROR + key, value)
        for disk in disks.values():
            disk.drain()
        return records

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, with the changelog offset it reflects, in one atomic
        batch per partition: called once the changelog holds it."""
        for p, offset in offsets.items():
            disk = self._disks.get(p)
            if disk is not None:
                disk.persist(offset)
