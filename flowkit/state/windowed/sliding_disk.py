"""One partition of a sliding table on disk: a RocksDB database, and the changes not yet
written to it.

The database holds what the partition's changelog holds, under the ``Stamp`` (the
changelog offset the data reflects) of the plain ``rocksdb://`` tables:

* ``R`` + key: the key's records ``[[time, value], ...]`` by time (the changelog has a
  record per key and time; here a key's are one value, read and written whole);
* ``c`` + end + time + key: the close order, one entry per window still to close (the
  window ending at the record at ``time`` when ``end == time``, else the one starting
  just after it), so the windows due to close are the first keys of ``c``;
* ``x`` + when + key: the expiry order, when the key's earliest record may leave;
* ``k`` + a changelog key: a record of what the worker keeps in memory while it runs
  (each source partition's stream time, the owner's sources' watermarks and sequence
  numbers, the last offset whose records closed windows), as the changelog has it;
* ``n``: how many keys have records (for metrics, without counting them).

Keys are JSON, as in the changelog. Changes wait in two layers until the changelog has
them, and ``c`` and ``x`` are time orders of the database (``disk_layers.py``).

>>> entry = CLOSING + at(10_000) + at(0) + b'"a"'
>>> parse_closing(entry)
(10000, 0, b'"a"')
"""

from __future__ import annotations

from .disk_layers import MIRROR, LayeredDatabase, at

__all__ = [
    "CLOSING",
    "COUNT",
    "EXPIRING",
    "FORMAT",
    "MIRROR",
    "RECORDS",
    "SlidingDisk",
    "at",
    "parse_closing",
]

RECORDS = b"R"
CLOSING = b"c"
EXPIRING = b"x"
COUNT = b"n"
_OFFSET = 2**63  # of a time in an entry (``at``)

FORMAT = 104
"""The stamp's format for a sliding table's database (a tumbling table's is 101, a session
table's 103: a table declared again with other windows does not read the other's data)."""


def parse_closing(entry: bytes) -> tuple[int, int, bytes]:
    """(end, record time, key as JSON) of a close-order entry."""
    return (
        int.from_bytes(entry[1:9], "big") - _OFFSET,
        int.from_bytes(entry[9:17], "big") - _OFFSET,
        entry[17:],
    )


class SlidingDisk(LayeredDatabase):
    """One partition's database, its stamp, its layers of unwritten changes, and the
    close and expiry orders of its windows and records."""

    __slots__ = ()

    order_prefixes = (CLOSING, EXPIRING)
