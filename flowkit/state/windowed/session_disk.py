"""One partition of a session table on disk: a RocksDB database, and the changes not yet
written to it.

The database holds what the partition's changelog holds, under the ``Stamp`` (the
changelog offset the data reflects) of the plain ``rocksdb://`` tables:

* ``k`` + a changelog key: a record of what the worker keeps in memory while it runs (a
  source partition's open sessions of a key, its stream time; an owner's open sessions
  of a key, its sources' watermarks, the last offset whose records closed sessions),
  as the changelog has it: a restart reads them back instead of the changelog;
* ``C`` + key: a key's closed sessions (the changelog's value), read from here only;
* ``x`` + end + start + key: the expiry order of the closed sessions, so that the
  sessions due to expire are the first keys of ``x`` (times 8 bytes, big-endian and
  offset by 2**63, so they sort in time order).

Keys are JSON, as in the changelog. Changes wait in two layers until the changelog has
them, and ``x`` is a time order of the database (``disk_layers.py``).

>>> end, start = at(10_000), at(0)
>>> expiry_key(b'"a"', 0, 10_000) == EXPIRY + end + start + b'"a"'
True
>>> parse_expiry(expiry_key(b'"a"', 0, 10_000))
(b'"a"', 0)
"""

from __future__ import annotations

from typing import Any

from . import wire
from .disk_layers import MIRROR, LayeredDatabase, at

__all__ = ["CLOSED", "EXPIRY", "MIRROR", "SessionDisk", "at", "expiry_key", "parse_expiry"]

CLOSED = b"C"
EXPIRY = b"x"

FORMAT = 103
"""The stamp's format for a session table's database (a tumbling table's is 101: a table
declared again with other windows does not read the other's data)."""


def expiry_key(kj: bytes, start: int, end: int) -> bytes:
    """The expiry entry of the closed session ``[start, end]`` of the key ``kj`` (JSON)."""
    return EXPIRY + at(end) + at(start) + kj


def parse_expiry(key: bytes) -> tuple[bytes, int]:
    """(the key as JSON, the start) of an expiry entry."""
    return key[17:], int.from_bytes(key[9:17], "big") - 2**63


class SessionDisk(LayeredDatabase):
    """One partition's database, its stamp, its layers of unwritten changes and the
    expiry order of its closed sessions."""

    __slots__ = ()

    order_prefixes = (EXPIRY,)

    # -- closed sessions ------------------------------------------------------------------

    def keep_closed(self, kj: bytes, start: int, end: int, session: bytes) -> None:
        """Add the closed session ``session`` (``[start, end, value]`` as JSON) to the
        key's, and to the expiry order."""
        key = CLOSED + kj
        raw = self.get(key)
        self.put(key, b"[" + session + b"]" if raw is None else raw[:-1] + b"," + session + b"]")
        self.add_due(expiry_key(kj, start, end))

    def set_closed(self, kj: bytes, old: list[list[Any]], new: list[list[Any]] | None) -> None:
        """Replace the key's closed sessions ``old`` by ``new`` (None or empty: none);
        ``DecodeError`` before any change for a time beyond 64 bits."""
        gone = [expiry_key(kj, s[0], s[1]) for s in old]
        fresh = [expiry_key(kj, s[0], s[1]) for s in new or ()]
        self.put(CLOSED + kj, wire.encode(new) if new else None)
        for entry in gone:
            self.put(entry, None)
        for entry in fresh:
            self.add_due(entry)

    def expire(self, before: int) -> dict[bytes, list[int]]:
        """Take out of the expiry order the closed sessions that end before ``before``:
        key (as JSON) -> their starts. The caller removes them from the key's sessions."""
        out: dict[bytes, list[int]] = {}
        for entry in self.take_due(EXPIRY, before):
            kj, start = parse_expiry(entry)
            out.setdefault(kj, []).append(start)
        return out
