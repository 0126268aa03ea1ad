"""One worker's buffers of a stream-stream join: both sides of each partition it holds.

Per partition: the stream time (largest timestamp read from either topic), and per side
the records waiting for a match, by key and offset. A heap says when each record's window
closes (for ``left``/``outer``: emit it unmatched, if it is) and when it expires. Changed
records go to the changelog at the next checkpoint; a record replayed after a restart
lands on its own offset, so the buffer holds it once (its pairs may be emitted again:
at-least-once).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ...errors import LateRecord, NotRunningError
from ...records import Message

if TYPE_CHECKING:
    from .declaration import StreamJoin

__all__ = ["JoinPart", "JoinStore", "Joined"]

NONE = -(2**62)
LEFT, RIGHT = 0, 1
CLOSE, EXPIRE = 0, 1
TIME_KEY = b'["t"]'
_encode = msgspec.json.encode
_key_decoder = msgspec.json.Decoder(tuple[int, bytes, int])
_entry_decoder = msgspec.json.Decoder(tuple[int, bool, bytes])


class Joined(NamedTuple):
    """One result of a stream-stream join. ``left`` or ``right`` is None for a record
    that found no match (``how="left"``/``"outer"``); ``timestamp`` is the later of the
    two records' timestamps (the record's own, when unmatched)."""

    key: Any
    left: Any
    right: Any
    timestamp: int


class JoinPart:
    """The buffers of one partition."""

    __slots__ = ("buffers", "dirty", "due", "logged", "number", "time", "time_logged")

    def __init__(self, number: int) -> None:
        self.number = number
        self.time = NONE
        self.time_logged = NONE
        # side -> key -> offset -> [timestamp, matched, raw value, decoded value or None]
        self.buffers: tuple[dict[bytes, dict[int, list[Any]]], ...] = ({}, {})
        self.due: list[tuple[int, int, int, bytes, int]] = []  # (time, kind, side, key, off)
        self.dirty: set[tuple[int, bytes, int]] = set()
        # Records the changelog holds: one that came and went between two checkpoints
        # needs no tombstone (most of them, when records expire faster than commits).
        self.logged: set[tuple[int, bytes, int]] = set()


class JoinStore:
    """A worker's state of one ``StreamJoin``."""

    def __init__(self, join: StreamJoin) -> None:
        self.join = join
        self.parts: dict[int, JoinPart] = {}
        self.late_records = 0
        self._decode = (join.left.decoder(), join.right.decoder())
        self._decode_key = join.left.decode_key
        # How long after its timestamp a record of each side may still be matched by a
        # record of the other side that is not late (the window, then grace).
        self._close = (join.after_ms + join.grace_ms, join.before_ms + join.grace_ms)
        how = join.how
        self._emits_unmatched = (how in ("left", "outer"), how == "outer")

    # -- processing -----------------------------------------------------------------------

    def part(self, partition: int) -> JoinPart:
        """The buffers of ``partition``, which this worker must hold."""
        part = self.parts.get(partition)
        if part is None:
            raise NotRunningError(f"join {self.join.name!r}: partition {partition} not held")
        return part

    def process(
        self, part: JoinPart, side: int, key: bytes, offset: int, ts: int, raw: bytes, value: Any
    ) -> list[Joined]:
        """Buffer one record of ``side`` and return the results it makes: its pairs, then
        the unmatched records whose windows its time closed."""
        join = self.join
        if ts > part.time:
            part.time = ts
        close = ts + self._close[side]
        if close < part.time:
            self.late_records += 1
            raise LateRecord(
                f"record at {ts} of {join.left.name if side == LEFT else join.right.name!r} "
                f"arrived after its join window closed (stream time {part.time}) in join "
                f"{join.name!r}"
            )
        if side == LEFT:
            lo, hi = ts - join.before_ms, ts + join.after_ms
        else:
            lo, hi = ts - join.after_ms, ts + join.before_ms
        out: list[Joined] = []
        matched = False
        other = part.buffers[1 - side].get(key)
        if other:
            okey = None
            for off, entry in other.items():
                if lo <= entry[0] <= hi:
                    matched = True
                    if not entry[1]:
                        entry[1] = True
                        part.dirty.add((1 - side, key, off))
                    if okey is None:
                        okey = self._decode_key(key)
                    theirs = self._value(1 - side, entry)
                    pair = (value, theirs) if side == LEFT else (theirs, value)
                    out.append(Joined(okey, pair[0], pair[1], max(ts, entry[0])))
        part.buffers[side].setdefault(key, {})[offset] = [ts, matched, raw, value]
        part.dirty.add((side, key, offset))
        if self._emits_unmatched[side] and not matched:
            heapq.heappush(part.due, (close, CLOSE, side, key, offset))
        heapq.heappush(part.due, (ts + self.join.retention_ms, EXPIRE, side, key, offset))
        if part.due[0][0] < part.time:
            out.extend(self.advance(part))
        return out

    def tick(self, part: JoinPart, ts: int) -> list[Joined]:
        """A record with nothing to join (no key or no value) still moves stream time."""
        if ts <= part.time:
            return []
        part.time = ts
        return self.advance(part)

    def advance(self, part: JoinPart) -> list[Joined]:
        """Close and expire what stream time has passed; the unmatched results."""
        out: list[Joined] = []
        due = part.due
        while due and due[0][0] < part.time:
            _, kind, side, key, offset = heapq.heappop(due)
            by_offset = part.buffers[side].get(key)
            entry = None if by_offset is None else by_offset.get(offset)
            if entry is None:
                continue
            if kind == EXPIRE:
                del by_offset[offset]  # type: ignore[union-attr]
                if not by_offset:
                    del part.buffers[side][key]
                part.dirty.add((side, key, offset))
            elif not entry[1]:
                entry[1] = True  # emitted once: a replayed close does not repeat it
                part.dirty.add((side, key, offset))
                value = self._value(side, entry)
                left, right = (value, None) if side == LEFT else (None, value)
                out.append(Joined(self._decode_key(key), left, right, entry[0]))
        return out

    def _value(self, side: int, entry: list[Any]) -> Any:
        if entry[3] is None:  # recovered from the changelog: decoded on first use
            entry[3] = self._decode[side](entry[2])
        return entry[3]

    # -- the worker's side ----------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these partitions."""
        for p in partitions:
            if p not in self.parts:
                self.parts[p] = JoinPart(p)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' buffers (after the final flush)."""
        for p in partitions:
            self.parts.pop(p, None)

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self.parts)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain: (partition, key, value or None)."""
        out: list[tuple[int, bytes, bytes | None]] = []
        for p, part in self.parts.items():
            logged = part.logged
            for ref in part.dirty:
                side, key, offset = ref
                entry = part.buffers[side].get(key, {}).get(offset)
                if entry is not None:
                    logged.add(ref)
                    value: bytes | None = _encode((entry[0], entry[1], entry[2]))
                elif ref in logged:
                    logged.discard(ref)
                    value = None
                else:
                    continue
                out.append((p, _encode(ref), value))
            part.dirty.clear()
            if part.time != part.time_logged:
                part.time_logged = part.time
                out.append((p, TIME_KEY, _encode(part.time)))
        return out

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild ``partition``'s buffers from its changelog."""
        self.assign([partition])
        part = self.parts[partition]
        for m in messages:
            if m.key is None:
                continue
            if m.key == TIME_KEY:
                if m.value is not None:
                    part.time = part.time_logged = msgspec.json.decode(m.value)
                continue
            side, key, offset = _key_decoder.decode(m.key)
            if m.value is None:
                part.buffers[side].get(key, {}).pop(offset, None)
                part.logged.discard((side, key, offset))
                continue
            ts, matched, raw = _entry_decoder.decode(m.value)
            part.buffers[side].setdefault(key, {})[offset] = [ts, matched, raw, None]
            part.logged.add((side, key, offset))
        part.due = []
        for side, by_key in enumerate(part.buffers):
            for key, by_offset in list(by_key.items()):
                if not by_offset:
                    del by_key[key]
                    continue
                for offset, entry in by_offset.items():
                    if self._emits_unmatched[side] and not entry[1]:
                        part.due.append((entry[0] + self._close[side], CLOSE, side, key, offset))
                    part.due.append((entry[0] + self.join.retention_ms, EXPIRE, side, key, offset))
        heapq.heapify(part.due)
