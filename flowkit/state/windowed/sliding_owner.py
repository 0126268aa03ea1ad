"""Stage 2 of a sliding table: the owning partition holds each key's records and closes
its sliding windows.

Every source partition ships each record it added, ``(time, value)`` with the source's
watermark then and a sequence number (``sliding_source.py``). The owner keeps a key's
records in time order, values of one time combined, for as long as a window may need
them. A key's windows are Kafka Streams' ``SlidingWindows``, both bounds included:

* ``[t - size, t]`` for every record time ``t``: the last ``size`` up to the record;
* ``[t + 1, t + 1 + size]`` for every record time ``t`` with a later record within
  ``size + 1``: the last ``size`` once ``t`` has left (unless a record at ``t + 1 + size``
  makes it that record's own window).

A window closes once every source's watermark (stream time minus grace) has passed its
end: its value, the records inside folded in time order with ``combine``, is emitted
once. A record that arrives later counts in the windows still open only; a window that
would have begun after it closed (Kafka Streams does not create it) never appears.

The cost is per window, not per key: adding a record pushes the close times of its two
windows on a heap (a time already held pushes nothing), and closing a window folds only
the records inside it, found by bisection. A key's records leave once every window that
holds them has closed and expired; then the key leaves.

With running updates (``emit_on="update"``), a record changes every open window that
holds it, and may make one more (the window just after it, when a later record is within
``size``): after each batch, each window its records changed goes out once with its value
then, unless that is the value it had before the batch. A window that closed in the batch
has its final value out instead.

>>> import operator
>>> from flowkit.windows import SlidingWindow
>>> from flowkit.records import Message
>>> owners = SlidingOwners(SlidingWindow(10, grace=0), sources=1, combine=operator.add)
>>> owners.assign([0])
>>> def rec(v): return Message("t", 0, 0, 0, None, v)
>>> sent = [wire.partial(t, 0, "k", [1, t, i]) for i, t in enumerate((0, 4_000), 1)]
>>> for key, window, value in owners.receive(0, [rec(v) for v in [*sent, wire.marker(30_000, 0)]]):
...     print(key, window.start, window.end, value)
k -10000 0 1
k -6000 4000 2
k 1 10001 1
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from operator import itemgetter
from typing import Any

import structlog

from ...errors import DecodeError
from ...records import Message
from ...streamtime import FutureGuard
from ...windows import SlidingSpec, Window
from ..refusals import valueless
from . import wire
from .stages import INF, NONE, Change, Emission, OwnersBase

__all__ = ["SlidingOwner", "SlidingOwners", "windows_of"]

log = structlog.get_logger(__name__)

_TS = itemgetter(0)
_MISSING: Any = object()
_NEW: Any = object()  # a window that did not exist before the batch


class SlidingOwner:
    """Stage-2 state of one owning partition of a sliding table."""

    __slots__ = (
        "close_time",
        "closing",
        "dirty",
        "emitted_through",
        "expiring",
        "logged",
        "records",
        "seen",
        "source_wm",
    )

    def __init__(self, sources: int) -> None:
        # key -> [[time, value], ...] by time (on disk: sliding_disk_owner.DiskRecords)
        self.records: MutableMapping[Any, list[list[Any]]] = {}
        self.source_wm: list[int] = [NONE] * sources
        self.close_time = NONE  # the least of source_wm: windows ending before it closed
        self.seen: list[int] = [0] * sources  # per source: the last sequence number applied
        self.logged: list[tuple[int, int] | None] = [None] * sources
        # (end, n, key, t): the window ending at record time t when end == t, else the one
        # starting just after t. Checked when popped: it may not exist (no later record).
        self.closing: list[tuple[int, int, Any, int]] = []
        # (when the key's earliest record expires, n, key): one entry per key.
        self.expiring: list[tuple[int, int, Any]] = []
        # (key, time) of the records changed since the last flush: the changelog holds a
        # record per key and time, so a flush writes what changed, not a key's every record.
        self.dirty: set[tuple[Any, int]] = set()
        # From the changelog: the last repartition offset whose records closed windows
        # in an earlier run (-1: none).
        self.emitted_through = -1


def fold(records: list[list[Any]], start: int, end: int, combine: Callable[..., Any]) -> Any:
    """The values of ``records`` (by time) within ``[start, end]``, folded in time order;
    None when there are none."""
    i = bisect.bisect_left(records, start, key=_TS)
    total: Any = None
    first = True
    for t, value in itertools.islice(records, i, None):
        if t > end:
            break
        total = value if first else combine(total, value)
        first = False
    return total


def start_after(records: list[list[Any]], end: int, ts: int) -> int | None:
    """The start of the window just after a record at ``ts`` (queued to close at ``end``),
    as ``records`` (by time) stand now: it exists when a record follows within it, and is
    its own unless that record is at its very end. None when it is not there, or is the
    window of the record at ``end``, closed by that one."""
    j = bisect.bisect_right(records, ts, key=_TS)
    if j == len(records) or records[j][0] > end:
        return None
    k = bisect.bisect_left(records, end, key=_TS)
    if k < len(records) and records[k][0] == end:
        return None
    return ts + 1


def _before(records: list[list[Any]], start: int, end: int, combine: Callable[..., Any]) -> Any:
    """The value of window ``[start, end]`` as ``records`` (by time) define it, or _NEW
    when they do not make it: no record at its end, nor one just before its start with a
    record inside it."""
    n = len(records)
    i = bisect.bisect_left(records, end, key=_TS)
    if not (i < n and records[i][0] == end):
        k = bisect.bisect_left(records, start - 1, key=_TS)
        if not (k < n and records[k][0] == start - 1 and k + 1 < n and records[k + 1][0] <= end):
            return _NEW
    return fold(records, start, end, combine)


def windows_of(records: list[list[Any]], size: int) -> Iterator[tuple[int, int]]:
    """Every sliding window ``(start, end)`` that ``records`` (by time) define, by end.

    >>> list(windows_of([[0, 1], [5, 1], [20, 1]], 10))
    [(-10, 0), (-5, 5), (1, 11), (10, 20)]
    """
    times = [r[0] for r in records]
    found: set[tuple[int, int]] = set()
    for i, t in enumerate(times):
        found.add((t - size, t))
        if i + 1 < len(times) and times[i + 1] <= t + 1 + size:
            found.add((t + 1, t + 1 + size))
    return iter(sorted(found, key=lambda w: (w[1], w[0])))


class SlidingOwners(OwnersBase[SlidingOwner]):
    """One worker's stage-2 state of one sliding table: the partitions it owns
    (``OwnersBase``), each a ``SlidingOwner`` of its keys' records."""

    def __init__(
        self,
        spec: SlidingSpec,
        *,
        sources: int,
        combine: Callable[[Any, Any], Any],
        name: str = "table",
        guard: FutureGuard | None = None,
        updates: bool = False,
    ) -> None:
        super().__init__(SlidingOwner, sources=sources, name=name, guard=guard, updates=updates)
        self.spec = spec
        self.size = spec.size_ms
        self.keep = spec.size_ms + 1 + spec.expires_ms  # a record's life after its time
        self.combine = combine
        self._n = itertools.count()

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Apply records and markers that arrived on repartition partition ``q``; return
        the windows that closed, earliest end first."""
        owner = self.owner_of(q)
        out: list[Emission] = []
        replays = future = 0
        guard = self.guard
        # With running updates: (key, start) of each window a record changed in this
        # batch -> its value before the batch (_NEW: it did not exist).
        touched: dict[tuple[Any, int], Any] | None = {} if self.updates else None
        for m in messages:
            if m.value is None:
                self.rejected.append((m, valueless()))
                continue
            try:
                kind, ts, src, key, value = wire.decode_record(m.value, self.sources, _timed, guard)
                if kind == "p":
                    amount, wm, seq = _record(value)
                else:
                    wm = ts
            except DecodeError as exc:
                self.rejected.append((m, exc))
                continue
            if kind == "p" and seq <= owner.seen[src]:
                replays += 1  # applied before a restart: its source sends it again
                continue
            if wm > owner.source_wm[src]:
                if guard is not None and wm > guard.future_limit and not guard.admits(wm):
                    future += 1
                else:
                    # What the source's watermark had closed when it added the record
                    # closes here first, as it had there.
                    owner.source_wm[src] = wm
                    close_time = min(owner.source_wm)
                    if close_time > owner.close_time:
                        owner.close_time = close_time
                        self._close(owner, out)
            if kind == "p":
                owner.seen[src] = seq
                if touched is not None:
                    self._touch(owner, key, ts, touched)
                self._insert(owner, key, ts, amount)
        if replays:
            self.replays_ignored += replays
            log.debug("records applied before ignored (a replay)", table=self.name, count=replays)
        if future:
            log.warning(
                "watermarks beyond max_future ignored", table=self.name, partition=q, count=future
            )
        if touched:
            self._updated(owner, touched)
        return out

    def _touch(
        self, owner: SlidingOwner, key: Any, ts: int, touched: dict[tuple[Any, int], Any]
    ) -> None:
        """Note the open windows that a record of ``key`` at ``ts``, not yet inserted,
        changes or makes, with their values before it (the first time in a batch)."""
        size, close_time = self.size, owner.close_time
        records = owner.records.get(key) or []
        i = bisect.bisect_left(records, ts, key=_TS)
        held = i < len(records) and records[i][0] == ts
        starts: list[int] = []
        # The windows ending at ts and at the records up to size after it hold ts ...
        j = bisect.bisect_right(records, ts + size, key=_TS)
        ends = [r[0] for r in itertools.islice(records, i, j)]
        if not held:
            ends.insert(0, ts)
        starts.extend(end - size for end in ends if end >= close_time)
        # ... and so do the windows just after the records up to size + 1 before it (ts
        # makes them, if none did).
        k = bisect.bisect_left(records, ts - size - 1, key=_TS)
        starts.extend(
            r[0] + 1 for r in itertools.islice(records, k, i) if r[0] + 1 + size >= close_time
        )
        # A new time makes the window just after it, when a later record is within it.
        later = records[i][0] if i < len(records) else None
        if (
            not held
            and later is not None
            and later <= ts + 1 + size
            and ts + 1 + size >= close_time
        ):
            starts.append(ts + 1)
        for start in starts:
            if (key, start) not in touched:
                touched[key, start] = _before(records, start, start + size, self.combine)

    def _updated(self, owner: SlidingOwner, touched: dict[tuple[Any, int], Any]) -> None:
        # After the closes: a window that closed in this batch has its final value out,
        # and no running update of it.
        size, close_time, combine = self.size, owner.close_time, self.combine
        for (key, start), before in sorted(touched.items(), key=lambda item: item[0][1]):
            end = start + size
            records = owner.records.get(key)
            if end < close_time or not records:
                continue
            value = fold(records, start, end, combine)
            if before is _NEW or value != before:
                self._updates.append((key, Window(start, end), value))

    def _insert(self, owner: SlidingOwner, key: Any, ts: int, amount: Any) -> None:
        records = owner.records.get(key)
        if records is None:
            records = owner.records[key] = []
            heapq.heappush(owner.expiring, (ts + self.keep, next(self._n), key))
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
            heapq.heappush(owner.closing, (ts, next(self._n), key, ts))
        end = ts + 1 + self.size
        if end >= close_time:
            heapq.heappush(owner.closing, (end, next(self._n), key, ts))

    def _close(self, owner: SlidingOwner, out: list[Emission]) -> None:
        close_time = owner.close_time
        closing = owner.closing
        size, combine = self.size, self.combine
        while closing and closing[0][0] < close_time:
            end, _, key, ts = heapq.heappop(closing)
            records = owner.records.get(key)
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
        expiring = owner.expiring
        keep = self.keep
        while expiring and expiring[0][0] < close_time:
            _, _, key = heapq.heappop(expiring)
            records = owner.records.get(key)
            if records is None:
                continue
            gone = bisect.bisect_left(records, close_time - keep, key=_TS)
            if gone:
                owner.dirty.update((key, r[0]) for r in records[:gone])
                del records[:gone]
            if records:
                heapq.heappush(expiring, (records[0][0] + keep, next(self._n), key))
            else:
                del owner.records[key]

    # -- changelog --------------------------------------------------------------------------

    def drain_changes_into(self, out: list[Change]) -> None:
        """Append stage 2's changelog records since the last drain: each changed record
        of a key and time (None once it has left), and per source its watermark and the
        last sequence number applied."""
        for q, owner in self.owners.items():
            self._drain_owner(q, owner, out)

    def _drain_owner(self, q: int, owner: SlidingOwner, out: list[Change]) -> None:
        for key, ts in owner.dirty:
            value = _MISSING
            records = owner.records.get(key)
            if records:
                i = bisect.bisect_left(records, ts, key=_TS)
                if i < len(records) and records[i][0] == ts:
                    value = records[i][1]
            out.append(
                (
                    q,
                    wire.encode(("R", key, ts)),
                    None if value is _MISSING else wire.encode((value,)),
                )
            )
        owner.dirty.clear()
        for src, state in enumerate(zip(owner.source_wm, owner.seen, strict=True)):
            if state != owner.logged[src]:
                owner.logged[src] = state
                out.append((q, wire.source_key(src), wire.encode(state)))

    def apply_record(self, owner: SlidingOwner, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2 (``kind`` "s", "e" or "R")."""
        if kind == "e":
            self.apply_emitted(owner, value)
            return
        if kind == "s":
            src = parts[1]
            owner.source_wm[src], owner.seen[src] = value if value is not None else (NONE, 0)
            owner.logged[src] = (owner.source_wm[src], owner.seen[src])
            return
        key, ts = wire.key_from_json(parts[1]), parts[2]
        records = owner.records.setdefault(key, [])
        i = bisect.bisect_left(records, ts, key=_TS)
        held = i < len(records) and records[i][0] == ts
        if value is not None:  # [value]: the value of the key's records at ts
            if held:
                records[i][1] = value[0]
            else:
                records.insert(i, [ts, value[0]])
        elif held:
            del records[i]
        if not records:
            del owner.records[key]

    def recovered(self, owner: SlidingOwner, partition: int) -> None:
        """Rebuild ``owner``'s close and expiry order after its changelog was applied."""
        self.trust_watermarks(owner, partition)
        close_time = owner.close_time = min(owner.source_wm)
        n, size = self._n, self.size
        owner.closing = [
            (end, next(n), key, t)
            for key, records in owner.records.items()
            for t, _ in records
            for end in (t, t + 1 + size)
            if end >= close_time
        ]
        heapq.heapify(owner.closing)
        owner.expiring = [
            (records[0][0] + self.keep, next(n), key) for key, records in owner.records.items()
        ]
        heapq.heapify(owner.expiring)


# A repartition record's time is one an event time reaches (within 2**62 ms, the guard's
# limit): the disk's orders hold no other.
_timed = wire.record_decoder(-INF, INF)


def _record(value: Any) -> tuple[Any, int, int]:
    # A record's value on the wire is [value, watermark, sequence]; anything else is not one.
    if (
        not isinstance(value, list)
        or len(value) != 3
        or type(value[1]) is not int
        or type(value[2]) is not int
        or value[2] < 1
    ):
        raise DecodeError(
            "not a repartition record: a sliding table's record is [value, watermark, sequence]"
        )
    return value[0], value[1], value[2]
