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

from . import sliding_disk
from .disk_mirrored import MirroredStages
from .sliding_disk import SlidingDisk
from .sliding_disk_owner import DiskSlidingOwner, DiskSlidingOwners
from .sliding_owner import SlidingOwners
from .sliding_source import SlidingSource
from .sliding_store import SlidingStore

__all__ = ["DiskSlidingStore"]

_RECORD_KEY = b'["R",'  # the changelog keys of an owner's records: on disk as they change


class DiskSlidingStore(MirroredStages, SlidingStore):
    """Stream times and watermarks in memory, the owners' records on disk, both recovered
    from a database per partition and the changelog's tail."""

    disk_format = sliding_disk.FORMAT
    disk_type = SlidingDisk
    source_type = SlidingSource
    disk_owners_type = DiskSlidingOwners
    owners: DiskSlidingOwners
    owners_type = SlidingOwners
    disk_only = _RECORD_KEY

    def keys_held(self, partition: int) -> int:
        """Keys whose records owner partition ``partition`` holds here (for metrics:
        counted as they come and go, not read)."""
        owner = self.owners.owners.get(partition)
        return 0 if owner is None else len(owner.records)

    # -- the changelog --------------------------------------------------------------------

    def flush_owner(self, partition: int) -> None:
        """Hand the owner's records changed since the last drain, and the windows of the
        records added since, to the database's layers."""
        owner = self.owners.owners.get(partition)
        if owner is not None:
            assert isinstance(owner, DiskSlidingOwner)
            owner.flush()
