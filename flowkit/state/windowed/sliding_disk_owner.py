"""Stage 2 of a sliding table on disk (``rocksdb://``): the owner's records, and the order
in which its windows close and its records expire, live in the partition's database
(``sliding_disk.py``), not in memory.

The rules are ``sliding_owner.py``'s, record for record: the windows a record makes, when
they close, what they hold, when records leave. What stays in memory per owned partition
is what the owner must keep hot: its sources' watermarks and sequence numbers, and the
keys it read or changed since the last checkpoint (``DiskRecords``: each key's records,
decoded once, written back once at the checkpoint if they changed), and the windows of
the records added since then (``young``: a heap, as the memory store's, handed to the
close order on disk at the checkpoint). Closing the windows due takes them from both:
when a worker catches up, event time runs ahead of the checkpoints and most windows
close young, never written; once it keeps up, they close from the disk. Expiring reads
the first keys of the expiry order.

Windows closing at the same time come out in the order of their record times, then keys
(the memory store's: in the order their records arrived).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, MutableMapping
from operator import itemgetter
from typing import Any, cast

from ...errors import DecodeError
from ...windows import Window
from . import wire
from .sliding_disk import (
    CLOSING,
    COUNT,
    EXPIRING,
    MIRROR,
    RECORDS,
    SlidingDisk,
    at,
    parse_closing,
)
from .sliding_owner import SlidingOwner, SlidingOwners, fold, start_after
from .stages import INF, Emission

__all__ = ["DiskRecords", "DiskSlidingOwner", "DiskSlidingOwners"]

_TS = itemgetter(0)
_ORDER = itemgetter(0, 1, 2)  # (end, record time, key as JSON): the disk's close order
_MISSING: Any = object()
_decode = wire.decode
_encode = wire.encode


class DiskRecords(MutableMapping[Any, list[list[Any]]]):
    """An owner's records by key, ``[[time, value], ...]`` by time, on disk: the keys read
    since the last ``flush`` are held decoded (``cache``), and those ``changed`` are
    written back at it. A caller that changes a key's list in place says so in
    ``changed``."""

    __slots__ = ("cache", "changed", "count", "disk")

    def __init__(self, disk: SlidingDisk) -> None:
        self.disk = disk
        self.cache: dict[Any, list[list[Any]] | None] = {}
        self.changed: set[Any] = set()
        raw = disk.get(COUNT)
        self.count = 0 if raw is None else int(raw)

    def get(self, key: Any, default: Any = None) -> Any:
        """``key``'s records, or ``default`` when it has none."""
        found = self.cache.get(key, _MISSING)
        if found is _MISSING:
            raw = self.disk.get(RECORDS + _encode(key))
            found = self.cache[key] = None if raw is None else _decode(raw)
        return default if found is None else found

    def __getitem__(self, key: Any) -> list[list[Any]]:
        found: list[list[Any]] | None = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __setitem__(self, key: Any, records: list[list[Any]]) -> None:
        if self.get(key) is None:
            self.count += 1
        self.cache[key] = records
        self.changed.add(key)

    def __delitem__(self, key: Any) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self.count -= 1
        self.cache[key] = None
        self.changed.add(key)

    def __iter__(self) -> Iterator[Any]:
        # A listing: the disk's keys, with what changed since the last flush.
        keys = {wire.key_from_json(_decode(k[1:])) for k, _ in self.disk.items(RECORDS)}
        keys.difference_update(self.changed)
        keys.update(k for k in self.changed if self.cache.get(k))
        return iter(keys)

    def __len__(self) -> int:
        return self.count

    def flush(self) -> None:
        """Write the keys that changed to the disk's pending changes, and forget the
        keys read."""
        disk = self.disk
        cache = self.cache
        for key in self.changed:
            records = cache.get(key)
            disk.put(RECORDS + _encode(key), _encode(records) if records else None)
        if self.changed:
            disk.put(COUNT, str(self.count).encode())
        self.changed.clear()
        cache.clear()


class DiskSlidingOwner(SlidingOwner):
    """Stage-2 state of one owning partition: its records and orders on disk, but for
    the windows of the records added since the last checkpoint (its ``closing`` and
    ``expiring`` stay empty)."""

    __slots__ = ("disk", "young", "young_expiring")

    def __init__(self, sources: int, disk: SlidingDisk) -> None:
        super().__init__(sources)
        self.disk = disk
        self.records = DiskRecords(disk)
        # (end, record time, key as JSON, n, key), a heap in the disk's close order: the
        # windows of the records added since the last checkpoint, not on disk yet.
        self.young: list[tuple[int, int, bytes, int, Any]] = []
        # (when, key as JSON, n, key): the expiry entries added since then, likewise.
        self.young_expiring: list[tuple[int, bytes, int, Any]] = []

    def flush(self) -> None:
        """Hand the records changed, and the young entries, to the disk's layers."""
        disk = self.disk
        for end, ts, kj, _, _ in self.young:
            disk.add_due(CLOSING + at(end) + at(ts) + kj)
        for when, kj, _, _ in self.young_expiring:
            disk.add_due(EXPIRING + at(when) + kj)
        self.young = []
        self.young_expiring = []
        cast(DiskRecords, self.records).flush()


class DiskSlidingOwners(SlidingOwners):
    """One worker's stage-2 state of one sliding table on disk: the partitions it owns,
    each a ``DiskSlidingOwner`` over its partition's database."""

    def assign(self, partitions: Any) -> None:
        """Nothing: the store opens each partition's database and ``attach``es it."""

    def attach(self, q: int, disk: SlidingDisk) -> DiskSlidingOwner:
        """Own partition ``q`` with the records in ``disk`` (its database)."""
        owner = DiskSlidingOwner(self.sources, disk)
        self.owners[q] = owner
        return owner

    # -- records and windows --------------------------------------------------------------

    def _insert(self, owner: SlidingOwner, key: Any, ts: int, amount: Any) -> None:
        records_of = _records(owner)
        held = cast(DiskSlidingOwner, owner)
        kj = _encode(key)
        records = records_of.cache.get(key, _MISSING)  # (read since the checkpoint)
        if records is _MISSING:
            records = records_of.get(key)
        if records is None:
            records = records_of[key] = []
            heapq.heappush(held.young_expiring, (ts + self.keep, kj, next(self._n), key))
        records_of.changed.add(key)
        owner.dirty.add((key, ts))
        if not records or records[-1][0] < ts:  # the common case: time moves forward
            records.append([ts, amount])
        else:
            i = bisect.bisect_left(records, ts, key=_TS)
            if records[i][0] == ts:  # a time held already: its windows are queued
                records[i][1] = self.combine(records[i][1], amount)
                return
            records.insert(i, [ts, amount])
        close_time = owner.close_time
        # Only windows still open: one that ends before the close time is never created.
        if ts >= close_time:
            heapq.heappush(held.young, (ts, ts, kj, next(self._n), key))
        end = ts + 1 + self.size
        if end >= close_time:
            heapq.heappush(held.young, (end, ts, kj, next(self._n), key))

    def _close(self, owner: SlidingOwner, out: list[Emission]) -> None:
        close_time = owner.close_time
        disk = _disk(owner)
        records_of = _records(owner)
        size, combine = self.size, self.combine
        cache = records_of.cache
        young = cast(DiskSlidingOwner, owner).young
        due: list[tuple[int, int, bytes, Any]] = []
        while young and young[0][0] < close_time:
            end, ts, kj, _, key = heapq.heappop(young)
            due.append((end, ts, kj, key))
        old = disk.take_due(CLOSING, close_time)
        if old:
            for entry in old:
                end, ts, kj = parse_closing(entry)
                due.append((end, ts, kj, wire.key_from_json(_decode(kj))))
            due.sort(key=_ORDER)
        for end, ts, _, key in due:
            records = cache.get(key, _MISSING)  # (read since the checkpoint)
            if records is _MISSING:
                records = records_of.get(key)
            if not records:
                continue
            if end == ts:  # the window ending at its record
                start = ts - size
            elif (after := start_after(records, end, ts)) is not None:
                start = after
            else:
                continue
            out.append((key, Window(start, end), fold(records, start, end, combine)))
            self.closed_windows += 1
        keep = self.keep
        young_expiring = cast(DiskSlidingOwner, owner).young_expiring
        expired: list[tuple[bytes, Any]] = []
        while young_expiring and young_expiring[0][0] < close_time:
            _, kj, _, key = heapq.heappop(young_expiring)
            expired.append((kj, key))
        for entry in disk.take_due(EXPIRING, close_time):
            kj = entry[9:]
            expired.append((kj, wire.key_from_json(_decode(kj))))
        for kj, key in expired:
            records = records_of.get(key)
            if records is None:
                continue
            gone = bisect.bisect_left(records, close_time - keep, key=_TS)
            if gone:
                owner.dirty.update((key, r[0]) for r in records[:gone])
                del records[:gone]
                records_of.changed.add(key)
            if records:
                heapq.heappush(young_expiring, (records[0][0] + keep, kj, next(self._n), key))
            else:
                del records_of[key]

    # -- the changelog --------------------------------------------------------------------

    def apply_record(self, owner: SlidingOwner, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2, in memory and on disk;
        ``DecodeError`` before any change for a time the disk cannot hold."""
        disk = _disk(owner)
        if kind != "R":
            super().apply_record(owner, kind, parts, value)
            disk.put(MIRROR + _encode(parts), None if value is None else _encode(value))
            return
        key, ts = wire.key_from_json(parts[1]), parts[2]
        if not -INF < ts < INF:
            raise DecodeError(f"not a changelog record: a record time beyond 2**62: {ts}")
        kj = _encode(key)
        windows = (CLOSING + at(ts) + at(ts) + kj, CLOSING + at(ts + 1 + self.size) + at(ts) + kj)
        records_of = _records(owner)
        records = records_of.get(key)
        if records is None:
            if value is None:
                return
            records = records_of[key] = []
        i = bisect.bisect_left(records, ts, key=_TS)
        held = i < len(records) and records[i][0] == ts
        if value is not None:  # [value]: the value of the key's records at ts
            if held:
                records[i][1] = value[0]
            else:
                records.insert(i, [ts, value[0]])
                for entry in windows:  # (those closed already leave in ``recovered``)
                    disk.add_due(entry)
                if i == 0:
                    disk.add_due(EXPIRING + at(ts + self.keep) + kj)
        elif held:
            del records[i]
            for entry in windows:
                disk.drop_due(entry)
        records_of.changed.add(key)
        if not records:
            del records_of[key]

    def recovered(self, owner: SlidingOwner, partition: int) -> None:
        """Tidy ``owner`` after its changelog was applied: windows that closed before
        leave the close order."""
        self.trust_watermarks(owner, partition)
        owner.close_time = min(owner.source_wm)
        _disk(owner).take_due(CLOSING, owner.close_time)

    def emitting(self, q: int, offset: int) -> tuple[bytes, bytes]:
        """As ``OwnersBase.emitting``, and on disk at the next persist: the record is
        sent (and acknowledged) outside the drains, so it joins the drained changes."""
        key, value = super().emitting(q, offset)
        owner = self.owners.get(q)
        if owner is not None:
            _disk(owner).draining[MIRROR + key] = value
        return key, value


def _disk(owner: SlidingOwner) -> SlidingDisk:
    return cast(DiskSlidingOwner, owner).disk


def _records(owner: SlidingOwner) -> DiskRecords:
    return cast(DiskRecords, owner.records)
