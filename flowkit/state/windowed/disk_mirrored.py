"""What the session and sliding stores on disk (``session_disk_store.py``,
``sliding_disk_store.py``) do alike: the state they keep in memory while the worker runs
(stage 1, and the owners' sources' watermarks and open state) is mirrored in each
partition's database under ``MIRROR`` + its changelog key, written at each checkpoint
with the changelog offset, and loaded from there when the partition is assigned; the
owner's bulk (closed sessions, a sliding key's records) lives on disk only, under the
changelog keys that begin with ``disk_only``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import DecodeError
from ...records import Message
from ..databases import LOCK_TRIES
from . import wire
from .disk_layers import MIRROR, LayeredDatabase
from .disk_partitions import PartitionDatabases

__all__ = ["MirroredStages"]


class MirroredStages(PartitionDatabases):
    """A mixin for a two-stage windowed store on disk: ``disk_type`` opens a partition's
    database, ``source_type`` and ``owners_type`` apply stage 1's and the owners' records
    in memory (the memory store's own methods), ``disk_owners_type`` holds the owners on
    disk (with ``attach`` for a partition's database), ``disk_only`` begins the changelog
    keys the owners write to disk themselves. The memory store sets ``parts``."""

    disk_type: ClassVar[type[LayeredDatabase]]
    source_type: ClassVar[Any]
    owners_type: ClassVar[Any]
    disk_owners_type: ClassVar[Any]
    disk_only: ClassVar[bytes]
    owners: Any
    parts: Any
    partitions: int
    changelog_shapes: Any
    stage1_kinds: Any  # the changelog kinds of stage 1's records

    if TYPE_CHECKING:  # the memory store's

        def recovered(self, part: Any) -> None: ...

    def __init__(
        self,
        table: Any,
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = LOCK_TRIES,
    ) -> None:
        super().__init__(table, now_ms)  # type: ignore[call-arg]  # the memory store's
        self.owners = self.disk_owners_type(
            self.owners.spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,
            updates=table.emit_on == "update",
        )
        self.start_databases(data_dir, broker, lock_tries)

    def assign(self, partitions: Iterable[int]) -> None:
        """Open these partitions' databases and load what is kept in memory."""
        for p in partitions:
            if p in self._disks:
                continue
            disk = self.disk_type.open(
                self._rocksdict, self.path(p), self.stamp(p), self.table.name, self.lock_tries
            )
            self._disks[p] = disk
            self.source_type.assign(self, [p])
            self.owners.attach(p, disk)
            self._load(p, disk)

    def _load(self, p: int, disk: LayeredDatabase) -> None:
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
                self.source_type.apply_record(self, part, kind, parts, v)
            else:
                self.owners_type.apply_record(self.owners, owner, kind, parts, v)
        self.owners.recovered(owner, p)
        self.recovered(part)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        ps = list(partitions)
        super().revoke(ps)  # the memory store's
        self.close_disks(ps)

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild ``partition`` from changelog records, written to disk with the offset
        after the last of them."""
        messages = list(messages)
        super().apply_changelog(partition, messages)  # type: ignore[misc]  # the memory store's
        if messages:
            self.flush_owner(partition)
            self._disks[partition].write_now(messages[-1].offset + 1)

    def apply_record(self, part: Any, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1, in memory and on disk."""
        self.source_type.apply_record(self, part, kind, parts, value)
        encoded = None if value is None else wire.encode(value)
        self._disks[part.number].put(MIRROR + wire.encode(parts), encoded)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain; the same changes go to disk at the
        next ``persist``."""
        records: list[tuple[int, bytes, bytes | None]] = super().drain_changes()  # type: ignore[misc]
        disks, disk_only = self._disks, self.disk_only
        for p, key, value in records:
            if not key.startswith(disk_only):
                disks[p].put(MIRROR + key, value)
        for p, disk in disks.items():
            self.flush_owner(p)
            disk.drain()
        return records

    def flush_owner(self, partition: int) -> None:
        """Hand what the owner of ``partition`` keeps apart to its database's layers
        (before a drain or a write): nothing, unless the store says otherwise."""

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, with the changelog offset it reflects, in one atomic
        batch per partition: called once the changelog holds it."""
        for p, offset in offsets.items():
            disk = self._disks.get(p)
            if disk is not None:
                disk.persist(offset)
