"""When a ``rocksdb://`` table's database writes its memtable to disk.

A plain table's databases write without RocksDB's write-ahead log: the changelog is the
source of truth, and each checkpoint writes the drained changes and the changelog offset
they reflect (the ``Stamp``) in one batch, in one column family. A batch lands in the
memtable and reaches the disk when the memtable is flushed; a flush writes whole batches,
in order (RocksDB's prefix guarantee for writes without the log, with ``atomic_flush``).
So what a crash (kill -9) leaves on disk is always some earlier checkpoint's data with
that checkpoint's stamp, and the restart replays the changelog from there: correct, and
no log to replay first.

``Unflushed`` bounds how far back that can be. A checkpoint flushes a partition's
database, and waits for it, once the entries written since its last flush reach a
fiftieth of its keys (and at least 1,000): a restart after a kill -9 then replays at most
about 2 % of the partition beyond what a clean stop would. A database whose oldest
unflushed entry is five minutes old is flushed in the background, at a checkpoint or
when a changelog is applied: the stamp on disk never lags far in time either (a
changelog's tombstones are compacted away after a day by default, and a replay from an
older offset would miss them). A clean stop flushes every database as it closes it.

>>> u = Unflushed()
>>> u.wrote(800, now=0.0); u.due(lambda: 50_000, now=1.0)
>>> u.wrote(400, now=1.0); u.due(lambda: 50_000, now=2.0)
'now'
>>> u.flushed(); u.wrote(1, now=10.0); u.due(lambda: 50_000, now=10.0 + STALE)
'soon'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

__all__ = ["FEW", "SHARE", "STALE", "Unflushed"]

FEW = 1_000  # entries: below this a flush is never due for their number
SHARE = 50  # a flush is due once the unflushed entries are 1/SHARE of the keys
STALE = 300.0  # seconds: an unflushed entry this old is flushed in the background

Due = Literal["now", "soon"]


class Unflushed:
    """The entries one database holds in its memtable only, and since when."""

    __slots__ = ("entries", "since")

    def __init__(self) -> None:
        self.entries = 0
        self.since = 0.0  # monotonic seconds of the oldest unflushed entry

    def wrote(self, entries: int, now: float) -> None:
        """``entries`` were written (without the log) at ``now``."""
        if not self.entries:
            self.since = now
        self.entries += entries

    def due(self, keys: Callable[[], int], now: float) -> Due | None:
        """``"now"`` (flush and wait) when the unflushed entries are many for a database
        of ``keys()`` keys (asked only past ``FEW``), ``"soon"`` (in the background) when
        they are old, else None."""
        entries = self.entries
        if entries >= FEW and entries * SHARE >= keys():
            return "now"
        return "soon" if self.stale(now) else None

    def stale(self, now: float) -> bool:
        """True when the oldest unflushed entry is ``STALE`` seconds old at ``now``."""
        return self.entries > 0 and now - self.since >= STALE

    def flushed(self) -> None:
        """The database's memtable was flushed (or a flush of it started)."""
        self.entries = 0
        self.since = 0.0
