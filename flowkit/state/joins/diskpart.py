"""One partition of a join whose buffers are in a database: the buffers (``store.py``'s
``JoinPart``), the database, and what the join keeps of it in memory between two
checkpoints (``disk.py``'s docstring says what and why)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..memtables import Unflushed
from .disktimes import BUCKETS, DiskTimes
from .layout import record_key
from .store import NEVER, NONE, JoinPart

if TYPE_CHECKING:
    from ..local import Stamp

__all__ = ["DISK", "OUT", "STORED", "DiskJoinPart", "stored_key"]

# More flags of an entry (see ``store.py``): its record is in the database; an expiry scan
# took it (settled with the record that did).
DISK, OUT = 8, 16
# An entry here has one more field than ``store.py``'s: its record's key in the database
# (``layout.record_key``), or None until one is needed.
STORED = 8


def stored_key(entry: list[Any]) -> bytes:
    """The key of ``entry``'s record in the database, kept on the entry once built."""
    stored: bytes | None = entry[8]
    if stored is None:
        stored = entry[8] = record_key(entry[6], entry[4], entry[0], entry[5])
    return stored


class DiskJoinPart(JoinPart):
    """The buffers of one partition, with its database."""

    __slots__ = (
        "ahead",
        "closed",
        "cursors",
        "cut",
        "db",
        "encoded",
        "evict",
        "expired",
        "fresh",
        "fresh_low",
        "on_disk",
        "reader",
        "stamp",
        "started",
        "top",
        "touched",
        "unflushed",
    )

    def __init__(self, number: int, db: Any, stamp: Stamp, buckets: int = BUCKETS) -> None:
        super().__init__(number)
        self.db = db
        self.stamp = stamp
        # Per side: which keys may have records on disk, from when (a match reads the
        # database only where they may).
        self.on_disk = (DiskTimes(buckets), DiskTimes(buckets))
        # Drained to the changelog, written to disk at the next persist: (entry, stored
        # value or None to delete), in drain order; and the fresh entries among them.
        self.encoded: list[tuple[list[Any], bytes | None]] = []
        self.evict: list[list[Any]] = []
        self.touched: dict[bytes, list[Any]] = {}
        # Per side: the time index below ``closed`` has been scanned for closing windows;
        # ``ahead`` is the time of the first record at or past it (NEVER: none), and
        # ``cursors`` an iterator standing there (None: seek again, after a write).
        self.closed = [NONE, NONE]
        self.ahead = [NEVER, NEVER]
        self.cursors: list[Any] = [None, None]
        # Per side: the time index below this was scanned for expiry; and below ``cut``
        # the next write deletes it whole (what an expiry scan took, all drained since).
        self.expired = [NONE, NONE]
        self.cut = [NONE, NONE]
        self.reader: Any = None  # an iterator for matches (None: a new one, after a write)
        self.fresh = 0  # records not yet on disk
        self.fresh_low = NEVER  # the oldest fresh record's time
        self.top = [-1, -1]  # the highest offset buffered per side: above it, no replay
        self.started = False  # the due times known (``DiskJoinStore._start``)
        self.unflushed = Unflushed()  # entries in the memtable (and the log) only

    def forget_cursors(self) -> None:
        """The database changed (or closes): the iterators over it go."""
        self.cursors = [None, None]
        self.reader = None
