"""Which keys of one side of a join may have records on disk in a time range: a bounded
filter that spares a match most of its reads of the database.

A record is matched by one range read of its key on the other side (``disk.py``). Most
such reads find nothing on disk: the record it would match is still in memory (read since
the last checkpoint), or there is none. ``DiskTimes`` keeps, per bucket of keys (by the
key's hash), the latest timestamp of a record of theirs written to disk; a range whose
start is past it holds none of them, and is not read. A key sharing a bucket with another
key's later record is read as before (a false positive costs the read, never a result),
and an expired record leaves its time behind until later ones pass it, so the buckets
need no deletes. Records on disk before the filter knew them (a database opened or
recovered from its changelog) are covered by ``floor``: the latest time on disk then.

Its memory is fixed: ``BUCKETS`` eight-byte times, whatever the records held.

>>> times = DiskTimes(buckets=8)
>>> times.may_hold(b"k", 0)
False
>>> times.wrote(b"k", 10)
>>> times.may_hold(b"k", 10), times.may_hold(b"k", 11)
(True, False)
>>> times.held(20)  # a database opened with records up to 20
>>> times.may_hold(b"other", 20), times.may_hold(b"other", 21)
(True, False)
"""

from __future__ import annotations

from array import array

__all__ = ["BUCKETS", "DiskTimes"]

BUCKETS = 1 << 14  # per side of a partition: 128 KB
_LOW, _HIGH = -(2**63), 2**63 - 1


class DiskTimes:
    """Per bucket of keys, the latest time of a record of theirs written to disk."""

    __slots__ = ("floor", "mask", "times")

    def __init__(self, buckets: int = BUCKETS) -> None:
        if buckets < 1 or buckets & (buckets - 1):
            raise ValueError(f"buckets must be a power of two, not {buckets}")
        self.times = array("q", [_LOW]) * buckets
        self.mask = buckets - 1
        self.floor = _LOW  # every record on disk that ``times`` may not know is up to this

    def wrote(self, key: bytes, ts: int) -> None:
        """A record of ``key`` at ``ts`` is written to disk."""
        i = hash(key) & self.mask
        if ts > self.times[i]:
            if ts < _HIGH:
                self.times[i] = ts
            else:  # past what a bucket holds: every key may have it
                self.held(ts)

    def held(self, last: int) -> None:
        """The database holds records, of any keys, up to ``last`` (opened, recovered)."""
        if last > self.floor:
            self.floor = last

    def may_hold(self, key: bytes, lo: int) -> bool:
        """False when no record of ``key`` on disk has a time at or after ``lo``."""
        return lo <= self.floor or lo <= self.times[hash(key) & self.mask]
