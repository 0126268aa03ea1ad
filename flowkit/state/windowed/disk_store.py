"""A tumbling or hopping table's state in one worker on local disk (``rocksdb://``).

One RocksDB database per held partition, under ``<data_dir>/<app>/<table>/<partition>``
as the plain ``rocksdb://`` tables' (``flowkit.state.databases``, whose database handling,
shared memory budget and stamp it uses): stage 2, the owner's partials and closed windows,
lives there (``disk_owner.py``), and so does stage 1, the open windows' partials of the
source partition, with only the changes since the last checkpoint in memory
(``disk_stage1.py``). Each database carries the changelog offset it
reflects, written in the same atomic batch, so a restart opens it and replays only the
changelog after that offset; local state that is not this partition's (another app,
table, partition count or broker, no offset, or a database that does not open) is
rebuilt from the changelog with one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...records import Message
from ...windows import Window
from ..databases import LOCK_TRIES
from . import disk, wire
from .disk import CLOSED, OWNED, WATERMARK, DiskPart
from .disk_owner import DiskOwner, DiskOwners
from .disk_partitions import PartitionDatabases
from .disk_stage1 import DiskStage1
from .owner import fold_sources
from .store import WindowedStore

if TYPE_CHECKING:
    from .table import WindowedTable

__all__ = ["DiskWindowedStore"]


class DiskWindowedStore(PartitionDatabases, WindowedStore, DiskStage1):
    """Both stages on disk, recovered from a database per partition and the changelog's
    tail; in memory, stage 1's changes since the last checkpoint."""

    disk_format = disk.FORMAT

    def __init__(
        self,
        table: WindowedTable[Any, Any],
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = LOCK_TRIES,
    ) -> None:
        super().__init__(table, now_ms)
        self.owners: DiskOwners = DiskOwners(  # type: ignore[assignment]
            table.spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,
            updates=table.emit_on == "update",
        )
        self.start_databases(data_dir, broker, lock_tries)
        self._disks: dict[int, DiskPart]
        self.start_disk_stage1(self._disks, table.combine)

    # -- partitions -----------------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Open these partitions' databases and take their stream times."""
        for p in partitions:
            if p in self._disks:
                continue
            part_disk = DiskPart.open(
                self._rocksdict, self.path(p), self.stamp(p), self.table.name, self.lock_tries
            )
            self._disks[p] = part_disk
            super().assign([p])
            owner = self.owners.attach(p, part_disk)
            self.owners.trust_watermarks(owner, p)
            self.load(self.parts[p])

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        ps = list(partitions)
        super().revoke(ps)
        self.close_disks(ps)

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from changelog records, written to disk
        with the offset after the last of them."""
        messages = list(messages)
        super().apply_changelog(partition, messages)
        if messages:
            part_disk = self._disks[partition]
            part_disk.forget_counts()  # (a record's key may be on disk already, or not)
            part_disk.write_now(messages[-1].offset + 1)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain; the same changes go to disk at the
        next ``persist``."""
        records = super().drain_changes()
        disks = self._disks
        for p, key, value in records:
            if key == wire.WATERMARK_KEY:
                disks[p].put(WATERMARK, value)
        for part_disk in disks.values():
            part_disk.drain()
        return records

    def persist(self, offsets: dict[int, int]) -> None:
        """Write what was drained, with the changelog offset it reflects, in one atomic
        batch per partition: called once the changelog holds it."""
        for p, offset in offsets.items():
            part_disk = self._disks.get(p)
            if part_disk is not None:
                part_disk.persist(offset)

    # -- reads ----------------------------------------------------------------------------

    def keys_held(self, partition: int) -> int:
        """Partials of the windows open on source partition ``partition`` (a key in each
        window it is in), as the memory store counts them: those on disk, which the
        drains keep counted (keys new since the last checkpoint count from the next)."""
        part = self.parts.get(partition)
        if part is None:
            return 0
        return self._disks[partition].partials_held(part.partials)

    def _owned(self, key: Any, local: dict[int, dict[int, Any]]) -> dict[Window, Any]:
        spec, combine = self.spec, self.table.combine
        out: dict[Window, Any] = {}
        owners = self.owners
        owner = owners.owners.get(self.table.partition_of(key))
        if owner is not None:
            gone = min(owner.source_wm) - spec.size_ms - spec.expires_ms
            for start in sorted(owner.closed_starts):
                if start <= gone:
                    continue  # expired (its keys leave the disk a step at a time)
                found, value = owners.final_of(owner, start, key)
                if found:
                    out[spec.window(start)] = value
            for start in sorted(owner.open_starts):
                parts = owners.parts_of(owner, start, key)
                if parts:
                    if start in local:
                        parts = {**parts, **local.pop(start)}
                    out[spec.window(start)] = fold_sources(combine, parts)
        return out

    def __iter__(self) -> Iterator[Any]:
        keys: set[Any] = set()
        for owner in self.owners.owners.values():
            keys.update(_keys(owner, CLOSED, 9, 0))
            keys.update(_keys(owner, OWNED, 9, 4))
        keys.update(self.stage1_keys())
        return iter(sorted(keys, key=repr))


def _keys(owner: DiskOwner, kind: bytes, head: int, tail: int) -> Iterator[Any]:
    for raw_key, _ in owner.disk.scan(kind):
        yield wire.key_from_json(wire.decode(raw_key[head : len(raw_key) - tail]))
