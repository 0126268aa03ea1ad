"""What the windowed stores on disk (tumbling and hopping, ``disk_store.py``; sessions,
``session_disk_store.py``; sliding, ``sliding_disk_store.py``) do alike with their
partitions' databases: where each lives, the stamp it must carry, and closing, wiping and
reading the offset of one."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..databases import open_rocksdict, write_checkpoint
from ..local import Stamp, partition_dir

__all__ = ["PartitionDatabases"]


class PartitionDatabases:
    """A mixin: ``_disks`` maps each held partition to its open database (an object with
    ``stamp`` and ``close()``), of the format ``disk_format``."""

    disk_format: ClassVar[int]
    table: Any
    data_dir: Path
    broker: str
    lock_tries: int
    _rocksdict: Any
    _disks: dict[int, Any]

    if TYPE_CHECKING:  # (the store's own, which close the databases they give up)

        def assign(self, partitions: Iterable[int]) -> None: ...
        def revoke(self, partitions: Iterable[int]) -> None: ...

    def start_databases(self, data_dir: Path, broker: str, lock_tries: int) -> None:
        """Keep the partitions' databases under ``data_dir``, stamped for ``broker``;
        none is open yet. (``rocksdict`` is imported now: a missing extra is one line.)"""
        self.data_dir = data_dir
        self.broker = broker
        self.lock_tries = lock_tries
        self._rocksdict = open_rocksdict()
        self._disks = {}

    def stamp(self, partition: int) -> Stamp:
        """The stamp this worker's state of ``partition`` must carry."""
        return Stamp.of(self.table, partition, self.broker, format=self.disk_format)

    def path(self, partition: int) -> Path:
        """The directory of ``partition``'s database."""
        return partition_dir(self.data_dir, self.table.app_name, self.table.name, partition)

    def checkpoint(self, partition: int, dest: Path) -> None:
        """Write a copy of ``partition``'s database, as on disk now (stamp included), to
        ``dest``: RocksDB's checkpoint, hard links to the same files where it can."""
        write_checkpoint(self._rocksdict, self._disks[partition].db, dest)

    def close_disks(self, partitions: Iterable[int]) -> None:
        """Close these partitions' databases (after the final checkpoint wrote them)."""
        for p in partitions:
            disk = self._disks.pop(p, None)
            if disk is not None:
                disk.close()

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
        disk = self._disks.get(partition)
        if disk is None or disk.stamp.offset < 0:
            return None
        offset: int = disk.stamp.offset
        return offset
