"""Stage 1 of a session table: each source partition's sessions, and its watermark.

A source partition keeps, per key, its sessions ``[start, end, value]`` in time order. A
record at ``ts`` joins every session of its key that starts at most ``gap`` after it or
ends at most ``gap`` before it, merging them (Kafka Streams' ``SessionWindows``). The
partition's close time is its stream time minus ``grace`` minus ``gap``: a session that
ends before it is closed here and goes to the partition that owns its key (``owner``
merges what every source sends); a record whose own session would end before it is late.

>>> import operator
>>> from flowkit.windows import SessionWindow
>>> src = SessionSource(SessionWindow(10, grace=0), operator.add, partitions=1,
...                     partition_of=lambda k: 0)
>>> src.assign([0]); part = src.parts[0]
>>> for ts in (0, 5_000, 30_000):
...     src.advance(part, ts); src.add(part, "k", ts, 1)
True
True
True
>>> [wire.decode(v) for _, _, v in src.drain_outbox()][0]   # [0, 5 s] closed at 30 s
['p', 0, 0, 'k', [5000, 2, 15001]]
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from ...windows import SessionSpec
from . import wire
from .stages import NONE, Sources

__all__ = ["Session", "SessionPart", "SessionSource", "find", "index_of", "merge_in"]

Session = list[Any]
"""``[start, end, value]``: the times of a session's first and last record, and its value."""


class SessionPart:
    """Stage-1 state of one source partition of a session table."""

    __slots__ = (
        "active",
        "changed",
        "closing",
        "dirty",
        "logged",
        "max_ts",
        "number",
        "partials",
        "sent_wm",
        "wm",
    )

    def __init__(self, number: int, updates: bool = False) -> None:
        self.number = number
        # With running updates: the keys added to since the last flush, whose open
        # sessions go to their owners then; None when the table emits on close only.
        self.changed: set[Any] | None = set() if updates else None
        self.partials: dict[Any, list[Session]] = {}  # key -> its sessions, by start
        self.wm = NONE  # stream time minus grace
        self.max_ts = NONE
        self.sent_wm = NONE
        self.active = -1.0  # when the partition went quiet (monotonic), or -1
        self.dirty: set[Any] = set()  # keys changed since the last changelog flush
        self.logged: tuple[int, ...] | None = None
        # (end, n, key, start) of each session, earliest end first. An entry goes stale
        # when its session grows or merges: it is checked, and pushed again, when popped,
        # so a record that extends a session costs no heap operation.
        self.closing: list[tuple[int, int, Any, int]] = []


def find(sessions: list[Session], ts: int, gap: int) -> tuple[int, int]:
    """The slice ``[i, j)`` of ``sessions`` (by start, disjoint) that a record at ``ts``
    joins: those within ``gap`` of it, both bounds included."""
    j = len(sessions)
    while j and sessions[j - 1][0] - gap > ts:
        j -= 1
    i = j
    while i and sessions[i - 1][1] + gap >= ts:
        i -= 1
    return i, j


def index_of(sessions: list[Any], start: int) -> int:
    """The index of the session that starts at ``start``, or -1."""
    for k, session in enumerate(sessions):
        if session[0] == start:
            return k
    return -1


def merge_in(
    sessions: list[Session], i: int, j: int, start: int, end: int, value: Any, combine: Any
) -> Session:
    """Replace ``sessions[i:j]`` by one session that also holds ``[start, end]`` with
    ``value``; its value is theirs folded in time order, then ``value``. Returns it."""
    if i == j:
        merged = [start, end, value]
    else:
        total = sessions[i][2]
        for k in range(i + 1, j):
            total = combine(total, sessions[k][2])
        merged = [
            min(start, sessions[i][0]),
            max(end, sessions[j - 1][1]),
            combine(total, value),
        ]
    sessions[i:j] = [merged]
    return merged


class SessionSource(Sources[SessionPart]):
    """One worker's stage-1 state of one session table: its source partitions
    (``Sources``), each a ``SessionPart`` of its keys' open sessions."""

    def __init__(
        self,
        spec: SessionSpec,
        combine: Callable[[Any, Any], Any],
        *,
        partitions: int,
        partition_of: Callable[[Any], int],
        encode_key: Callable[[Any], bytes] = wire.encode,
        now_ms: Callable[[], int] = lambda: 0,
        name: str = "table",
        updates: bool = False,
    ) -> None:
        super().__init__(
            spec,
            SessionPart,
            partitions=partitions,
            partition_of=partition_of,
            encode_key=encode_key,
            now_ms=now_ms,
            name=name,
            updates=updates,
        )
        self.gap = spec.gap_ms
        self.combine = combine
        self._n = itertools.count()

    # -- adds -----------------------------------------------------------------------------

    def add(self, part: SessionPart, key: Any, ts: int, amount: Any) -> bool:
        """Put a record of ``key`` at ``ts`` into its session; False when it is late (its
        session would already be closed). The caller has moved stream time to ``ts``."""
        gap = self.gap
        sessions = part.partials.get(key)
        if sessions is None:
            if ts < part.wm - gap:
                return False
            part.partials[key] = [[ts, ts, amount]]
            heapq.heappush(part.closing, (ts, next(self._n), key, ts))
        else:
            last = sessions[-1]
            if last[0] - gap <= ts <= last[1] + gap and (
                len(sessions) == 1 or sessions[-2][1] + gap < ts
            ):
                # The common case: the key's latest session, and no other, takes it.
                last[2] = self.combine(last[2], amount)
                if ts > last[1]:
                    last[1] = ts
                elif ts < last[0]:
                    last[0] = ts
                    heapq.heappush(part.closing, (last[1], next(self._n), key, ts))
            else:
                i, j = find(sessions, ts, gap)
                if i == j and ts < part.wm - gap:
                    return False
                before = sessions[i][0] if i < j else None
                merged = merge_in(sessions, i, j, ts, ts, amount, self.combine)
                if merged[0] != before:
                    heapq.heappush(part.closing, (merged[1], next(self._n), key, merged[0]))
        part.dirty.add(key)
        return True

    def set_wm(self, part: SessionPart, wm: int) -> None:
        """Move ``part``'s watermark to ``wm`` (if later) and close what ends before
        ``wm - gap``."""
        if wm <= part.wm:
            return
        part.wm = wm
        closing = part.closing
        if closing and closing[0][0] < wm - self.gap:
            self._close(part, wm - self.gap)

    def _close(self, part: SessionPart, close_time: int) -> None:
        closing = part.closing
        p, gap = part.number, self.gap
        while closing and closing[0][0] < close_time:
            due, _, key, start = heapq.heappop(closing)
            sessions = part.partials.get(key)
            if not sessions:
                continue
            k = index_of(sessions, start)
            if k < 0:
                continue  # merged into an earlier session, which has an entry of its own
            session = sessions[k]
            end = session[1]
            if end != due:
                # It grew since: look again when its end is due, so that sessions close
                # in the order of their ends (the owner relies on it).
                heapq.heappush(closing, (end, next(self._n), key, start))
                continue
            del sessions[k]
            if not sessions:
                del part.partials[key]
            part.dirty.add(key)
            q = self._partition_of(key)
            # With the lowest watermark that closes it (at most this partition's): the
            # owner learns it with the session, so it closes there no sooner than here,
            # and not before this, its last version, has arrived (session_owner.py).
            piece = wire.partial(start, p, key, [end, session[2], end + gap + 1])
            self._outbox.append((q, self._encode_key(key), piece))

    # -- the worker's side ----------------------------------------------------------------

    @property
    def marker_step(self) -> int:
        # A marker when the watermark has moved into a new span of ``gap``: owners learn
        # a source's exact watermark with each session it sends them, and the others'
        # at most one gap late, at one marker per gap of stream time, not per flush.
        return self.gap

    def ship_updates(self) -> None:
        # Running updates: each open session of a key added to since the last flush, as
        # it is now, once per flush however many records changed it. The owner takes a
        # piece that overlaps an earlier one of the same source as its newer version.
        for p, part in self.parts.items():
            changed = part.changed
            if not changed:
                continue
            wm = part.wm
            for key in sorted(changed, key=repr):
                sessions = part.partials.get(key)
                if not sessions:
                    continue  # closed since, and shipped as such
                q = self._partition_of(key)
                encoded = self._encode_key(key)
                for start, end, value in sessions:
                    piece = wire.partial(start, p, key, [end, value, wm])
                    self._outbox.append((q, encoded, piece))
            changed.clear()

    def drain_changes_into(self, out: list[tuple[int, bytes, bytes | None]]) -> None:
        """Append stage 1's changelog records since the last drain to ``out``: each
        changed key's sessions whole (None when it has none left), so a merged or
        shipped session never comes back from the changelog."""
        for p, part in self.parts.items():
            for key in part.dirty:
                sessions = part.partials.get(key)
                out.append(
                    (p, wire.encode(("S", key)), None if not sessions else wire.encode(sessions))
                )
            part.dirty.clear()
            self.log_watermark(part, out)

    def apply_record(self, part: SessionPart, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1 (``kind`` "w" or "S")."""
        if kind == "w":
            self.apply_watermark(part, value)
            return
        key = wire.key_from_json(parts[1])
        if value is None:
            part.partials.pop(key, None)
        else:
            part.partials[key] = [list(s) for s in value]

    def recovered(self, part: SessionPart) -> None:
        """Rebuild ``part``'s close order after its changelog was applied; a stream time
        beyond ``max_future`` starts again."""
        self.trust_watermark(part)
        part.closing = [
            (s[1], next(self._n), key, s[0]) for key, ss in part.partials.items() for s in ss
        ]
        heapq.heapify(part.closing)
