"""When a checkpoint flushes a ``rocksdb://`` table's database: what a kill -9 costs it.

Each checkpoint writes a partition's drained changes and the changelog offset they
reflect in one batch. RocksDB puts the batch in its memtable and its write-ahead log, and
writes the memtable to disk when it is full (4 MB) or flushed. After a crash, opening the
database replays the log into a memtable and flushes it first: about 25 ms a MB here,
up to the whole 4 MB a partition, before any record of the changelog is read.

``Unflushed`` bounds that log. A checkpoint flushes a partition's database, and waits for
it, once the entries written since its last flush reach a fiftieth of its keys (and at
least 1,000): a restart after a kill -9 then replays at most that from the log, about
2 % of a large partition, where a clean stop replays none (closing flushes). A flush
costs about what replaying its entries would, once, in the checkpoint; small tables are
spared flushes of a few entries each, whose fixed cost (a new file, synced) exceeds what
they would save.

>>> u = Unflushed()
>>> u.wrote(800); u.due(lambda: 50_000)
False
>>> u.wrote(400); u.due(lambda: 50_000), u.due(lambda: 100_000)
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FEW", "SHARE", "Unflushed", "flush_if_due"]

FEW = 1_000  # entries: below this a flush is never due
SHARE = 50  # a flush is due once the unflushed entries are 1/SHARE of the keys


class Unflushed:
    """The entries one database holds in its memtable (and log) only."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries = 0

    def wrote(self, entries: int) -> None:
        """``entries`` more were written."""
        self.entries += entries

    def due(self, keys: Callable[[], int]) -> bool:
        """True when the unflushed entries are many for a database of ``keys()`` keys
        (asked only past ``FEW``)."""
        entries = self.entries
        return entries >= FEW and entries * SHARE >= keys()

    def flushed(self) -> None:
        """The database's memtable was flushed."""
        self.entries = 0


def flush_if_due(db: Any, unflushed: Unflushed) -> None:
    """After a checkpoint's write: flush ``db`` (a rocksdict ``Rdict``), and wait for it,
    if ``unflushed`` says its memtables hold much that is not on disk. Every store on
    ``rocksdb://`` (tables, windowed tables, sessions, joins) calls this at persist."""
    if unflushed.due(lambda: int(db.property_int_value("rocksdb.estimate-num-keys") or 0)):
        db.flush()
        unflushed.flushed()
