"""Local state: what a table partition keeps on this machine between runs, and whose it is.

A partition's local state (a RocksDB database, or a snapshot of a memory store) carries a
``Stamp``: the app, table, partition count and broker it belongs to, and the changelog
offset it reflects (the offset of the next changelog record it has not seen). On
assignment the worker replays only the changelog after that offset; local state whose
stamp names another app, table, partition count or broker is not used.

>>> stamp = Stamp(app="shop", table="totals", partition=0, partitions=4, broker="memory://")
>>> Stamp.decode(stamp.with_offset(120).encode()).offset
120
>>> stamp.mismatch(Stamp.decode(stamp.with_offset(7).encode())) is None
True
>>> stamp.mismatch(Stamp(app="shop", table="totals", partition=0, partitions=8, broker="memory://"))
'it was written for 8 partitions, not 4'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

__all__ = ["STORES", "Stamp", "StoreKind", "check_store", "partition_dir"]

StoreKind = Literal["memory://", "rocksdb://"]
STORES: tuple[StoreKind, ...] = ("memory://", "rocksdb://")

FORMAT = 1  # of the stamp and of what it stamps; another format is rebuilt


class Stamp(msgspec.Struct, frozen=True, kw_only=True):
    """Whose local state this is, and the changelog offset it reflects (-1: none yet)."""

    app: str
    table: str
    partition: int
    partitions: int
    broker: str
    offset: int = -1
    format: int = FORMAT
    timed: bool = False  # values carry their write time (a table with ttl=)

    @classmethod
    def of(cls, declared: Any, partition: int, broker: str, **more: Any) -> Stamp:
        """The stamp of partition ``partition`` of ``declared`` (a table or a join: its
        ``app_name``, ``name`` and ``partitions``) on ``broker``; ``more`` sets
        ``format`` or ``timed``."""
        return cls(
            app=declared.app_name,
            table=declared.name,
            partition=partition,
            partitions=declared.partitions,
            broker=broker,
            **more,
        )

    def with_offset(self, offset: int) -> Stamp:
        """This stamp at ``offset``."""
        return msgspec.structs.replace(self, offset=offset)

    def encode(self) -> bytes:
        """The stamp as JSON bytes."""
        return msgspec.json.encode(self)

    @staticmethod
    def decode(data: bytes) -> Stamp:
        """A stamp from ``encode``'s bytes (``msgspec.DecodeError`` if it is not one)."""
        return msgspec.json.decode(data, type=Stamp)

    def mismatch(self, found: Stamp) -> str | None:
        """Why local state stamped ``found`` is not this partition's, or None if it is."""
        if found.format != self.format:
            return f"it has format {found.format}, not {self.format}"
        for field in ("app", "table", "partition", "broker"):
            mine, theirs = getattr(self, field), getattr(found, field)
            if mine != theirs:
                return f"it belongs to {field} {theirs!r}, not {mine!r}"
        if found.partitions != self.partitions:
            return f"it was written for {found.partitions} partitions, not {self.partitions}"
        if found.timed != self.timed:
            had = "had" if found.timed else "had no"
            return f"it has {'' if found.timed else 'no '}write times (the table {had} a ttl)"
        return None


def check_store(value: object, what: str) -> StoreKind:
    """``value`` if it names a store, else ``DefinitionError``.

    >>> check_store("rocksdb://", "App()")
    'rocksdb://'
    >>> check_store("rocks", "App()")
    Traceback (most recent call last):
    flowkit.errors.DefinitionError: App(): store 'rocks' is not one of 'memory://', 'rocksdb://'
    """
    from ..errors import DefinitionError

    for kind in STORES:
        if value == kind:
            return kind
    raise DefinitionError(f"{what}: store {value!r} is not one of 'memory://', 'rocksdb://'")


def check_data_dir(data_dir: Path, what: str) -> None:
    """Refuse, in one line, a data directory the worker could not write its local state
    to: a file, or under one, or (for a user other than root) a directory it may not write.

    Checked before the worker connects, so that a wrong setting is an error that names it
    rather than a crash at the first assignment (and a crash loop under a supervisor).

    >>> import tempfile; here = Path(tempfile.mkdtemp())
    >>> check_data_dir(here / "new" / "dir", "--data-dir")   # made when first needed
    >>> (here / "a-file").touch()
    >>> check_data_dir(here / "a-file" / "d", "data dir")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: data dir .../a-file/d: .../a-file is a file, not a directory
    """
    import os

    from ..errors import ConfigurationError

    path = data_dir.absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the nearest part that exists: the rest is made
    where = f"{what} {path}" + ("" if existing == path else f": {existing}")
    if not existing.is_dir():
        raise ConfigurationError(f"{where} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{where} is not writable by this user")


def partition_dir(data_dir: Path, app: str, table: str, partition: int) -> Path:
    """Where one partition of one table keeps its local state."""
    return data_dir / app / table / str(partition)
