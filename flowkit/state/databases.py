"""Opening a partition's RocksDB database (through ``rocksdict``), for every store on
``rocksdb://``: tables, windowed and session tables, and joins' buffers.

Every database of a process shares one set of options (memtables and a block cache of
bounded size, a bloom filter). Each database carries its ``Stamp`` under ``STAMP``: what
it holds (app, table, partition, broker, format) and the changelog offset it reflects.
``open_database`` uses a database only if its stamp is the one wanted, and otherwise says
why in one line and starts afresh (the partition is then rebuilt from its changelog).

``rocksdict`` is an optional extra (``pip install "flowkit[rocksdb]"``), imported only when
a store asks for it.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog

from ..errors import ConfigurationError
from .local import Stamp

__all__ = [
    "LOCK_TRIES",
    "STAMP",
    "open_database",
    "open_db",
    "open_rocksdict",
    "write_checkpoint",
]

log = structlog.get_logger(__name__)

STAMP = b"\x00stamp"  # sorts before every data key of every store
LOCK_TRIES = 20  # 0.1 s apart
_MEMTABLES = 64 << 20  # bytes of memtables, all databases of the process together
# One database's memtable: flushed to disk when it is full, or by a checkpoint (see
# ``flowkit.state.memtables``). What it holds unflushed is what a restart after a crash
# replays from the write-ahead log (about 25 ms a MB here).
_MEMTABLE = 4 << 20
_BLOCK_CACHE = 32 << 20  # bytes of blocks read from disk, all databases together


def open_rocksdict() -> Any:
    """The ``rocksdict`` module, or ``ConfigurationError`` naming the extra."""
    try:
        import rocksdict
    except ImportError:
        raise ConfigurationError(
            'the rocksdb:// store needs the rocksdb extra: pip install "flowkit[rocksdb]"'
        ) from None
    return rocksdict


def write_checkpoint(rocksdict: Any, db: Any, dest: Path) -> None:
    """Write a copy of the open database ``db``, as on disk now (stamp included), to
    ``dest`` (replaced): RocksDB's checkpoint, hard links to the same files where it can."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    rocksdict.Checkpoint(db).create_checkpoint(str(dest))


def open_database(
    rocksdict: Any, path: Path, want: Stamp, *, owner: str, lock_tries: int = LOCK_TRIES
) -> tuple[Any, Stamp | None]:
    """The database of one partition at ``path`` and the stamp it carries, if that is
    ``want`` (at any offset); else, with one log line, a fresh one and None (what was
    there is deleted: the partition is rebuilt from its changelog). An empty database
    (never checkpointed) is used as it is, with None and no line. ``owner`` names the
    table or join in messages."""
    why = None
    db = None
    if path.exists():
        try:
            db = _locked_db(rocksdict, path, owner, want.partition, lock_tries)
            raw = db.get(STAMP)
            if raw is None and next(iter(db.keys()), None) is None:
                # Opened, never checkpointed (a worker stopped before its first one):
                # nothing to rebuild, nothing to say.
                return db, None
            if raw is None:
                why = "it has no changelog offset"
            else:
                why = want.mismatch(found := Stamp.decode(raw))
                if why is None:
                    return db, found
        except ConfigurationError:
            raise
        except (Exception, msgspec.DecodeError) as exc:  # rocksdict raises Exception
            why = f"it does not open ({exc})"
        log.warning(
            "local state not used; rebuilding from the changelog",
            table=want.table,
            partition=want.partition,
            path=str(path),
            reason=why,
        )
        if db is not None:
            db.close()
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return open_db(rocksdict, path), None


def _locked_db(rocksdict: Any, path: Path, owner: str, p: int, tries: int) -> Any:
    # Another worker process on this machine may still hold the partition it is
    # giving up: wait a little for it, and never delete what it holds.
    for attempt in range(tries):
        try:
            return open_db(rocksdict, path)
        except Exception as exc:
            if "lock" not in str(exc).lower():
                raise
            if attempt + 1 < tries:
                time.sleep(0.1)
    raise ConfigurationError(
        f"{owner}: the local state of partition {p} ({path}) is held "
        "by another process; give each worker its own --data-dir or stop the other one"
    )


def open_db(rocksdict: Any, path: Path) -> Any:
    """The database at ``path`` (created if missing), with the process's shared options."""
    return rocksdict.Rdict(str(path), _options(rocksdict))


_shared: dict[str, Any] = {}
_sharing = threading.Lock()


def _options(rocksdict: Any) -> Any:
    """Options of every database this process opens. Memtables (``_MEMTABLES``) and the
    block cache (``_BLOCK_CACHE``) are shared by all of them, so the memory RocksDB takes
    does not grow with the partitions held (its defaults: 128 MB of memtables and an 8 MB
    cache for each); a bloom filter spares the disk a read for most keys it has not got
    (a new key's first ``table[key] += 1``)."""
    with _sharing:  # databases open side by side, in threads: one set made, once
        if not _shared:
            _shared["cache"] = rocksdict.Cache(_BLOCK_CACHE)
            _shared["memtables"] = rocksdict.WriteBufferManager(_MEMTABLES, False)
    options = rocksdict.Options(raw_mode=True)
    options.set_write_buffer_manager(_shared["memtables"])
    options.set_write_buffer_size(_MEMTABLE)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(_shared["cache"])
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options
