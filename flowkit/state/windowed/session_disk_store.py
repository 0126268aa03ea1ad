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

from . import session_disk
from .disk_mirrored import MirroredStages
from .session_disk import SessionDisk
from .session_disk_owner import DiskSessionOwners
from .session_owner import SessionOwners
from .session_source import SessionSource
from .session_store import SessionStore

__all__ = ["DiskSessionStore"]

_CLOSED_KEY = b'["C",'  # the changelog keys of closed sessions: on disk as they happen


class DiskSessionStore(MirroredStages, SessionStore):
    """Open sessions in memory, closed ones on disk, both recovered from a database per
    partition and the changelog's tail."""

    disk_format = session_disk.FORMAT
    disk_type = SessionDisk
    source_type = SessionSource
    disk_owners_type = DiskSessionOwners
    owners: DiskSessionOwners
    owners_type = SessionOwners
    disk_only = _CLOSED_KEY
