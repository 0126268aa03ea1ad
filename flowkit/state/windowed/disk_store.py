"""A tumbling or hopping table's state in one worker on local disk (``rocksdb://``).

One RocksDB database per held partition, under ``<data_dir>/<app>/<table>/<partition>``
as the plain ``rocksdb://`` tables' (``flowkit.state.rocks``, whose database handling,
shared memory budget and stamp it uses): stage 2, the owner's partials and closed windows,
lives there (``disk_owner.py``); stage 1, the open windows' partials of the source
partition, is in memory while the worker runs, as the memory store's, and is written to
the same database at each checkpoint. Each database carries the changelog offset it
reflects, written in the same atomic batch, so a restart opens it and replays only the
changelog after that offset; local state that is not this partition's (another app,
table, partition count or broker, no offset, or a database that does not open) is
rebuilt from the changelog with one log line.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...records import Message
from ...windows import Window
from ..local import Stamp, partition_dir
from ..rocks import open_rocksdict
from . import disk, wire
from .disk import CLOSED, OWNED, PARTIAL, WATERMARK, DiskPart
from .disk_owner import DiskOwner, DiskOwners
from .owner import fold_sources
from .stage1 import Part
from .store import WindowedStore

if TYPE_CHECKING:
    from .table import WindowedTable

__all__ = ["DiskWindowedStore"]

_P_KEY = b'["p",'
_LOCK_TRIES = 20  # 0.1 s apart, as the plain tables'


class DiskWindowedStore(WindowedStore):
    """Stage 1 in memory, stage 2 on disk, both recovered from a database per partition
    and the changelog's tail."""

    def __init__(
        self,
        table: WindowedTable[Any, Any],
        now_ms: Callable[[], int],
        *,
        data_dir: Path,
        broker: str,
        lock_tries: int = _LOCK_TRIES,
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
        self.data_dir = data_dir
        self.broker = broker
        self.lock_tries = lock_tries
        self._rocksdict = open_rocksdict()
        self._disks: dict[int, DiskPart] = {}

    # -- partitions -----------------------------------------------------------------------

    def stamp(self, partition: int) -> Stamp:
        """The stamp this worker's state of ``partition`` must carry."""
        return Stamp.of(self.table, partition, self.broker, format=disk.FORMAT)

    def path(self, partition: int) -> Path:
        """The directory of ``partition``'s database."""
        return partition_dir(self.data_dir, self.table.app_name, self.table.name, partition)

    def assign(self, partitions: Iterable[int]) -> None:
        """Open these partitions' databases and load what stage 1 keeps in memory."""
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
            self._load_stage1(self.parts[p], part_disk)

    def _load_stage1(self, part: Part, part_disk: DiskPart) -> None:
        raw = part_disk.get(WATERMARK)
        if raw is not None:
            self.apply_watermark(part, wire.decode(raw))
        for key, value in part_disk.scan(PARTIAL):
            start = disk.start_of(key)
            k = wire.key_from_json(wire.decode(key[9:]))
            part.partials.setdefault(start, {})[k] = wire.decode(value)
        self.recovered(part)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        ps = list(partitions)
        super().revoke(ps)
        for p in ps:
            part_disk = self._disks.pop(p, None)
            if part_disk is not None:
                part_disk.close()

    def aclose(self) -> None:
        """Close every database."""
        self.revoke(list(self._disks))

    def reset(self, partition: int) -> None:
        """Forget the local state of ``partition`` (it is rebuilt from the changelog)."""
        self.revoke([partition])
        shutil.rmtree(self.path(partition), ignore_errors=True)
        self.assign([partition])

    def local_offset(self, partition: int) -> int | None:
        """The changelog offset the local state of ``partition`` reflects, if any."""
        part_disk = self._disks.get(partition)
        if part_disk is None or part_disk.stamp.offset < 0:
            return None
        return part_disk.stamp.offset

    # -- the changelog --------------------------------------------------------------------

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from changelog records, written to disk
        with the offset after the last of them."""
        messages = list(messages)
        super().apply_changelog(partition, messages)
        if messages:
            self._disks[partition].write_now(messages[-1].offset + 1)

    def apply_record(self, part: Part, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1, in memory and on disk."""
        encoded = None if value is None else wire.encode(value)
        # The disk key first: a start beyond 64 bits is refused before anything changes.
        dk = WATERMARK if kind == "w" else PARTIAL + disk.start(parts[1]) + wire.encode(parts[2])
        super().apply_record(part, kind, parts, value)
        self._disks[part.number].put(dk, encoded)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain; the same changes go to disk at the
        next ``persist``."""
        records = super().drain_changes()
        disks = self._disks
        for p, key, value in records:
            if key == wire.WATERMARK_KEY:
                disks[p].put(WATERMARK, value)
            elif key.startswith(_P_KEY):
                # ["p",<start>,<key>]: the start is digits, the key the JSON up to "]".
                comma = key.index(b",", 5)
                start = int(key[5:comma])
                disks[p].put(PARTIAL + disk.start(start) + key[comma + 1 : -1], value)
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

    def _owned(self, key: Any, local: dict[int, dict[int, Any]]) -> dict[Window, Any]:
        spec, combine = self.spec, self.table.combine
        out: dict[Window, Any] = {}
        owners = self.owners
        owner = owners.owners.get(self.table.partition_of(key))
        if owner is not None:
            for start in sorted(owner.closed_starts):
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
        for part in self.parts.values():
            for window in part.partials.values():
                keys.update(window)
        return iter(sorted(keys, key=repr))


def _keys(owner: DiskOwner, kind: bytes, head: int, tail: int) -> Iterator[Any]:
    for raw_key, _ in owner.disk.scan(kind):
        yield wire.key_from_json(wire.decode(raw_key[head : len(raw_key) - tail]))
