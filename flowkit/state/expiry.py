"""Key expiry: when a table key written at ``t`` is due (``t + ttl``), found without a scan.

A table declared with ``ttl=`` keeps, per partition, the time each key was last written
and an ``ExpiryIndex``: the keys by the time they are due. A sweep (at each checkpoint)
takes only the keys due by then, so its cost is the number of keys it looks at, never the
table's size. A key written again gets a new entry and its old one goes stale: the sweep
skips it (the caller checks the key's current write time), and the index is rebuilt when
stale entries outnumber live ones, so it never grows beyond about twice the table.

>>> index = ExpiryIndex()
>>> index.add("a", 100); index.add("b", 50); index.add("a", 300)  # a written again
>>> list(index.due(100)), list(index.due(1000))
([('b', 50), ('a', 100)], [('a', 300)])
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Any

from .. import durations
from ..errors import DefinitionError

__all__ = ["CLOCKS", "ExpiryIndex", "ttl_ms"]

CLOCKS = ("event", "wall")
"""What a ttl is measured on: the table's stream time (record timestamps), or the
worker's wall clock."""


def ttl_ms(ttl: object, clock: object, what: str) -> int:
    """``ttl`` (seconds or a ``timedelta``, > 0) in milliseconds, or a one-line
    ``DefinitionError`` naming ``what``.

    >>> ttl_ms(60, "event", "table 't'")
    60000
    >>> ttl_ms(0, "event", "table 't'")
    Traceback (most recent call last):
    flowkit.errors.DefinitionError: table 't': ttl must be more than 0 seconds, not 0
    """
    s = durations.seconds(ttl, f"{what}: ttl")
    if not s > 0 or s == float("inf"):
        raise DefinitionError(f"{what}: ttl must be more than 0 seconds, not {s:g}")
    ms = round(s * 1000)
    if ms < 1:
        raise DefinitionError(f"{what}: ttl must be at least 1 ms, not {s:g} s")
    if clock not in CLOCKS:
        raise DefinitionError(f"{what}: ttl_clock must be 'event' or 'wall', not {clock!r}")
    return ms


class ExpiryIndex:
    """Keys by the time they are due, for one table partition.

    A heap of distinct due times (integers: keys of any type are never compared) and a
    list of keys per due time.
    """

    __slots__ = ("_entries", "_heap", "_keys")

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._keys: dict[int, list[Any]] = {}
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return self._entries

    def add(self, key: Any, due: int) -> None:
        """``key`` is due at ``due`` (ms)."""
        keys = self._keys.get(due)
        if keys is None:
            keys = self._keys[due] = []
            heapq.heappush(self._heap, due)
        keys.append(key)
        self._entries += 1

    def due(self, now: int) -> Iterator[tuple[Any, int]]:
        """Take every entry due at or before ``now``: (key, due time), earliest first."""
        heap, by_due = self._heap, self._keys
        while heap and heap[0] <= now:
            due = heapq.heappop(heap)
            keys = by_due.pop(due)
            self._entries -= len(keys)
            for key in keys:
                yield key, due

    def compact(self, written: Mapping[Any, int], ttl: int) -> None:
        """Rebuild from the live keys' write times when stale entries outnumber them."""
        if self._entries > 2 * len(written) + 1024:
            self.rebuild(written, ttl)

    def rebuild(self, written: Mapping[Any, int], ttl: int) -> None:
        """Hold exactly the live keys, due ``ttl`` after their write times."""
        self._heap, self._keys, self._entries = [], {}, 0
        for key, at in written.items():
            self.add(key, at + ttl)
