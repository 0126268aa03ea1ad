"""Stage 2 of a session table on disk (``rocksdb://``): the owner's closed sessions live
in the partition's database (``session_disk.py``), not in memory.

The rules are ``session_owner.py``'s, record for record: pieces merge into the key's open
sessions, a session closes once every source's watermark minus ``gap`` has passed its
end, its final value stays readable until ``expires``. What stays in memory per owned
partition is what waits there for the other sources: the open sessions the sources have
sent (a session closed at its source, until the others' watermarks close it here) and
their close order. The closed sessions, each key's under one database key, and their
expiry order are on disk: closing a session is one read and one write of its key,
expiring is a read of the first keys of the expiry order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from . import wire
from .session_disk import CLOSED, MIRROR, SessionDisk
from .session_owner import SessionOwner, SessionOwners

__all__ = ["DiskSessionOwner", "DiskSessionOwners"]

_decode = wire.decode
_encode = wire.encode


class DiskSessionOwner(SessionOwner):
    """Stage-2 state of one owning partition: open sessions in memory, closed on disk
    (its ``closed`` and ``expiring`` stay empty)."""

    __slots__ = ("disk",)

    def __init__(self, sources: int, disk: SessionDisk) -> None:
        super().__init__(sources)
        self.disk = disk


class DiskSessionOwners(SessionOwners):
    """One worker's stage-2 state of one session table on disk: the partitions it owns,
    each a ``DiskSessionOwner`` over its partition's database."""

    def assign(self, partitions: Iterable[int]) -> None:
        """Nothing: the store opens each partition's database and ``attach``es it."""

    def attach(self, q: int, disk: SessionDisk) -> DiskSessionOwner:
        """Own partition ``q`` with the closed sessions in ``disk`` (its database)."""
        owner = DiskSessionOwner(self.sources, disk)
        self.owners[q] = owner
        return owner

    # -- closed sessions ------------------------------------------------------------------

    def keep_closed(self, owner: SessionOwner, key: Any, start: int, end: int, total: Any) -> None:
        """Keep a session that closed readable, on disk, until it expires."""
        disk = _disk(owner)
        disk.keep_closed(_encode(key), start, end, _encode([start, end, total]))

    def expire(self, owner: SessionOwner, expire_time: int) -> None:
        """Forget the closed sessions that end before ``expire_time``."""
        disk = _disk(owner)
        for kj, starts in disk.expire(expire_time).items():
            raw = disk.get(CLOSED + kj)
            kept = [] if raw is None else [s for s in _decode(raw) if s[0] not in starts]
            disk.put(CLOSED + kj, _encode(kept) if kept else None)
            owner.dirty_closed.add(wire.key_from_json(_decode(kj)))

    def closed_of(self, owner: SessionOwner, key: Any) -> list[list[Any]]:
        """``key``'s closed sessions, ``[start, end, value]`` each (until they expire)."""
        raw = _disk(owner).get(CLOSED + _encode(key))
        return [] if raw is None else _decode(raw)

    def _covered(self, owner: SessionOwner, key: Any, start: int, end: int) -> bool:
        return any(s[0] <= start and end <= s[1] for s in self.closed_of(owner, key))

    def closed_record(self, owner: SessionOwner, key: Any) -> bytes | None:
        """The changelog value of ``key``'s closed sessions: the disk's, as it is."""
        found: bytes | None = _disk(owner).get(CLOSED + _encode(key))
        return found

    def set_closed(self, owner: SessionOwner, key: Any, closed: list[list[Any]] | None) -> None:
        """Replace ``key``'s closed sessions (a changelog record; None: none)."""
        disk = _disk(owner)
        disk.set_closed(_encode(key), self.closed_of(owner, key), closed)

    def closed_keys(self, owner: SessionOwner) -> Iterable[Any]:
        """The keys with closed sessions (a listing: read from disk)."""
        disk = _disk(owner)
        return [wire.key_from_json(_decode(k[1:])) for k, _ in disk.items(CLOSED)]

    # -- the changelog --------------------------------------------------------------------

    def apply_record(self, owner: SessionOwner, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2, in memory and on disk."""
        super().apply_record(owner, kind, parts, value)
        if kind != "C":  # (closed sessions went to disk in ``set_closed``)
            disk = _disk(owner)
            disk.put(MIRROR + _encode(parts), None if value is None else _encode(value))

    def emitting(self, q: int, offset: int) -> tuple[bytes, bytes]:
        """As ``OwnersBase.emitting``, and on disk at the next persist: the record is
        sent (and acknowledged) outside the drains, so it joins the drained changes."""
        key, value = super().emitting(q, offset)
        owner = self.owners.get(q)
        if owner is not None:
            _disk(owner).draining[MIRROR + key] = value
        return key, value


def _disk(owner: SessionOwner) -> SessionDisk:
    return cast(DiskSessionOwner, owner).disk
