"""One worker's buffers of a stream-stream join: both sides of each partition it holds.

Per partition: the stream time (largest timestamp read from either topic), and per side
the records waiting for a match, by key. Each record is one small list (an *entry*) that
every structure shares, so a record costs a few appends and no hashing beyond its key:

* ``buffers[side][key]``: the entries of that key, in arrival order;
* ``expiring``: every entry, in timestamp order; one deque serves both sides, since a
  record of either side expires ``before + after + grace`` after its timestamp;
* ``closing[side]`` (left and outer joins): the entries that may still come out
  unmatched, in timestamp order, popped when their window closes.

Records mostly arrive in timestamp order (the join merges its two topics by timestamp), so
these are deques with appends at the tail; a record older than the tail (out of order
within the grace) goes to a small heap beside its deque instead. ``advance`` runs only
when stream time passes the earliest due time, and pops what is due.

Changed entries are listed in ``dirty`` (flagged on the entry, so listed once) and written
to the changelog at the next checkpoint; an entry that came and went between two
checkpoints is never written, and needs no tombstone. A record replayed after a restart
finds its own offset in the buffer and is not added twice (its pairs may be emitted again:
at-least-once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ...codecs import DECODE_FAILURES, StrCodec, decode_error_message
from ...errors import DecodeError, LateRecord, NotRunningError
from ...records import Message
from ...streamtime import FutureGuard
from ..refusals import keyless

if TYPE_CHECKING:
    from .declaration import StreamJoin

__all__ = ["JoinPart", "JoinStore", "Joined"]

NONE = -(2**62)
NEVER = 2**62
LEFT, RIGHT = 0, 1
TIME_KEY = b'["t"]'
# An entry: [timestamp, matched (or emitted unmatched), raw value, value or None (not
# decoded yet), key, offset, side, flags]
TS, MATCHED, RAW, VALUE, KEY, OFFSET, SIDE, FLAGS = range(8)
DIRTY, LOGGED, GONE = 1, 2, 4  # flags: in ``dirty``; in the changelog; expired
_encode = msgspec.json.encode
_key_decoder = msgspec.json.Decoder(tuple[int, bytes, int])
_entry_decoder = msgspec.json.Decoder(tuple[int, bool, bytes])
# (stream time, offsets), or the stream time alone (written by the first version)
_state_decoder = msgspec.json.Decoder(tuple[int, int, int] | int)


class Joined(NamedTuple):
    """One result of a stream-stream join. ``left`` or ``right`` is None for a record
    that found no match (``how="left"``/``"outer"``); ``timestamp`` is the later of the
    two records' timestamps (the record's own, when unmatched)."""

    key: Any
    left: Any
    right: Any
    timestamp: int


_new = tuple.__new__  # Joined(...) without the generated __new__: a C call per result


def _key_decoder_of(join: StreamJoin) -> Callable[[bytes], Any]:
    """The left topic's ``decode_key``; for text keys (the usual) one call, not three."""
    if not isinstance(join.left.key_codec, StrCodec):
        return join.left.decode_key

    def decode(data: bytes) -> Any:
        try:
            return data.decode()
        except UnicodeDecodeError:
            return data  # as decode_key does with a key that does not decode

    return decode


class JoinPart:
    """The buffers of one partition."""

    __slots__ = (
        "buffers",
        "close_due",
        "closing",
        "dirty",
        "done",
        "due",
        "expire_due",
        "expiring",
        "high",
        "late",
        "logged",
        "number",
        "recovered",
        "replayed",
        "settle",
        "time",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.time = NONE
        # The offset of the last record done (its results handed out), per side; the
        # changelog holds them with the stream time then (``logged``), and after a
        # restart the records up to them are not processed again (``replayed``): their
        # state is recovered, and their results were stored before the changelog was
        # written (see the checkpoint's order).
        self.high = [-1, -1]
        self.done = NONE  # the stream time when the last record was done
        self.logged = (NONE, -1, -1)
        self.replayed = (-1, -1)
        # Entries the record being processed closed or expired: marked once it is done.
        self.settle: list[list[Any]] = []
        self.buffers: tuple[dict[bytes, list[list[Any]]], dict[bytes, list[list[Any]]]] = ({}, {})
        self.expiring: deque[list[Any]] = deque()
        self.closing: tuple[deque[list[Any]], deque[list[Any]]] = (deque(), deque())
        # Entries older than their deque's tail: (timestamp, side, offset, entry) heaps,
        # for ``expiring``, ``closing[LEFT]`` and ``closing[RIGHT]``.
        self.late: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        self.dirty: list[list[Any]] = []
        # Stream time past these: a window closes, records expire; ``due`` is the first.
        self.close_due = self.expire_due = self.due = NEVER
        # While the changelog is read: (side, key, offset) -> entry, made into the buffers
        # when the partition is first used.
        self.recovered: dict[tuple[int, bytes, int], list[Any]] | None = None


class JoinStore(FutureGuard):
    """A worker's state of one ``StreamJoin``, with its guard on stream time
    (``max_future``), which the join's stream loop applies to every record it hands over."""

    def __init__(self, join: StreamJoin, now_ms: Callable[[], int]) -> None:
        super().__init__(join.max_future_ms, now_ms=now_ms, owner=f"join {join.name!r}")
        self.join = join
        self.table = join  # what the worker's state keeper calls a store's declaration
        self.parts: dict[int, JoinPart] = {}
        self.late_records = 0
        # Changelog records that are not this join's: the worker dead-letters them.
        self.rejected: list[tuple[Message, Exception]] = []
        self._decode = (join.left.decoder(), join.right.decoder())
        self._decode_key = _key_decoder_of(join)
        # How long after its timestamp a record of each side may still be matched by a
        # record of the other side that is not late (the window, then grace).
        self._close = (join.after_ms + join.grace_ms, join.before_ms + join.grace_ms)
        self._retention = join.retention_ms
        # The window of a new record of each side: (before its time, after its time).
        self._window = ((join.before_ms, join.after_ms), (join.after_ms, join.before_ms))
        how = join.how
        self._emits_unmatched = (how in ("left", "outer"), how == "outer")
        self._closers = tuple(
            (side, self._close[side]) for side in (LEFT, RIGHT) if self._emits_unmatched[side]
        )
        # Records expire a little after their retention, in bursts (see ``_expire``).
        self._slack = max(self._retention // 8, 1)
        self._keep = self._retention + self._slack

    # -- processing -----------------------------------------------------------------------

    def part(self, partition: int) -> JoinPart:
        """The buffers of ``partition``, which this worker must hold."""
        part = self.parts.get(partition)
        if part is None:
            raise NotRunningError(f"join {self.join.name!r}: partition {partition} not held")
        if part.recovered is not None:
            self._rebuild(part)
        return part

    def process(
        self, part: JoinPart, side: int, key: bytes, offset: int, ts: int, raw: bytes, value: Any
    ) -> list[Joined] | None:
        """Buffer one record of ``side`` and return the results it makes (its pairs, then
        the unmatched records whose windows its time closed), or None. ``ts`` has passed
        the guard on stream time (``max_future``): the join's stream loop checks it, where
        it reads the times of both topics' next records, before this and ``tick``."""
        if offset <= part.replayed[side]:
            return None  # recovered with the state: processed before the restart
        time = part.time
        if ts > time:
            part.time = time = ts
        close = ts + self._close[side]
        if close < time:
            self._late(part, side, ts)
        out: list[Joined] | None = None
        matched = False
        other = part.buffers[1 - side].get(key)
        if other:
            before, after = self._window[side]
            lo, hi = ts - before, ts + after
            okey = self._decode_key(key)
            emits = self._emits_unmatched[1 - side]
            dirty = part.dirty
            out = []
            for entry in other:
                t = entry[0]
                if lo <= t <= hi:
                    matched = True
                    if emits and not entry[1]:
                        entry[1] = True  # the changelog must know: it will not come out alone
                        if not entry[7] & DIRTY:
                            entry[7] |= DIRTY
                            dirty.append(entry)
                    theirs = entry[3]
                    if theirs is None:
                        theirs = self._value(part, entry)
                    if side:
                        out.append(_new(Joined, (okey, theirs, value, t if t > ts else ts)))
                    else:
                        out.append(_new(Joined, (okey, value, theirs, t if t > ts else ts)))
        mine = part.buffers[side]
        entries = mine.get(key)
        entry = [ts, matched, raw, value, key, offset, side, DIRTY]
        if entries is None:
            mine[key] = [entry]
        else:
            for e in entries:
                if e[5] == offset:  # replayed after a restart: buffered already
                    return self._replayed(part, e, matched, out)
            entries.append(entry)
        part.dirty.append(entry)
        expiring = part.expiring
        if expiring and ts < expiring[-1][0]:
            heappush(part.late[0], (ts, side, offset, entry))
        else:
            expiring.append(entry)
        due = ts + self._keep
        if due < part.expire_due:
            part.expire_due = due
            if due < part.due:
                part.due = due
        if self._emits_unmatched[side] and not matched:
            closing = part.closing[side]
            if closing and ts < closing[-1][0]:
                heappush(part.late[1 + side], (ts, side, offset, entry))
            else:
                closing.append(entry)
            if close < part.close_due:
                part.close_due = close
                if close < part.due:
                    part.due = close
        if time > part.due:
            unmatched = self.advance(part)
            if unmatched:
                if out is None:
                    return unmatched
                out.extend(unmatched)
        return out

    def _replayed(
        self, part: JoinPart, entry: list[Any], matched: bool, out: list[Joined] | None
    ) -> list[Joined] | None:
        """A record read again after a restart, buffered already: it is not added again,
        and what its time closes comes out, as it did the first time."""
        if matched and not entry[1]:  # it may no longer come out unmatched
            entry[1] = True
            self._changed(part, entry)
        if part.time > part.due:
            unmatched = self.advance(part)
            if unmatched:
                if out is None:
                    return unmatched
                out.extend(unmatched)
        return out

    @staticmethod
    def _changed(part: JoinPart, entry: list[Any]) -> None:
        if not entry[7] & DIRTY:
            entry[7] |= DIRTY
            part.dirty.append(entry)

    def _late(self, part: JoinPart, side: int, ts: int) -> None:
        join = self.join
        self.late_records += 1
        topic = join.left.name if side == LEFT else join.right.name
        raise LateRecord(
            f"record at {ts} of {topic!r} arrived after its join window closed "
            f"(stream time {part.time}) in join {join.name!r}"
        )

    def tick(self, part: JoinPart, ts: int) -> list[Joined] | None:
        """A record with nothing to join (no key or no value) still moves stream time."""
        if ts <= part.time:
            return None
        part.time = ts
        if ts > part.due:
            return self.advance(part)
        return None

    def advance(self, part: JoinPart) -> list[Joined] | None:
        """Close and expire what stream time has passed; the unmatched results, or None."""
        time = part.time
        out = self._close_windows(part, time) if time > part.close_due else None
        if time > part.expire_due:
            self._expire(part, time)
        close_due, expire_due = part.close_due, part.expire_due
        part.due = close_due if close_due < expire_due else expire_due
        return out

    def _close_windows(self, part: JoinPart, time: int) -> list[Joined] | None:
        out: list[Joined] | None = None
        settle = part.settle
        due = NEVER
        for side, close in self._closers:
            limit = time - close  # entries before this have closed
            closing = part.closing[side]
            heap = part.late[1 + side]
            while True:
                if closing and closing[0][0] < limit:
                    entry = closing.popleft()
                elif heap and heap[0][0] < limit:
                    entry = heappop(heap)[3]
                else:
                    break
                if entry[1]:
                    continue  # matched: it never comes out alone
                settle.append(entry)
                if out is None:
                    out = []
                out.append(self._alone(part, side, entry))
            if closing and closing[0][0] + close < due:
                due = closing[0][0] + close
            if heap and heap[0][0] + close < due:
                due = heap[0][0] + close
        part.close_due = due
        return out

    def _expire(self, part: JoinPart, time: int) -> None:
        # Expiry frees memory only (an expired record cannot match one that is not late),
        # so it runs once per ``_slack`` of stream time, not for every record.
        limit = time - self._retention
        expiring = part.expiring
        heap = part.late[0]
        buffers = part.buffers
        settle = part.settle
        while True:
            if expiring and expiring[0][0] < limit:
                entry = expiring.popleft()
            elif heap and heap[0][0] < limit:
                entry = heappop(heap)[3]
            else:
                break
            by_key = buffers[entry[6]]
            entries = by_key[entry[4]]
            if len(entries) == 1:
                del by_key[entry[4]]
            elif entries[0] is entry:  # the oldest of its key, mostly
                del entries[0]
            else:
                for i, e in enumerate(entries):
                    if e is entry:
                        del entries[i]
                        break
            settle.append(entry)
        due = NEVER
        keep = self._keep
        if expiring:
            due = expiring[0][0] + keep
        if heap and heap[0][0] + keep < due:
            due = heap[0][0] + keep
        part.expire_due = due

    def settle(self, part: JoinPart) -> None:
        """The record whose time closed or expired entries is done (its results are with
        the agent): the changelog may now say that they came out, or are gone. Until
        then a checkpoint does not write it, so a crash before cannot lose them."""
        dirty = part.dirty
        for entry in part.settle:
            flags = entry[7]
            if entry[0] + self._retention < part.time:  # expired
                entry[7] = flags | GONE
                if not flags & LOGGED:
                    continue  # never written: no tombstone
            else:  # came out unmatched: a replayed close does not repeat it
                entry[1] = True
            if not flags & DIRTY:
                entry[7] |= DIRTY
                dirty.append(entry)
        part.settle = []

    def _alone(self, part: JoinPart, side: int, entry: list[Any]) -> Joined:
        """The result of a record whose window closed without a match: its value beside
        nothing (``None`` for the other side)."""
        value = entry[3]
        if value is None:
            value = self._value(part, entry)
        key = self._decode_key(entry[4])
        result = (key, value, None, entry[0]) if side == LEFT else (key, None, value, entry[0])
        return _new(Joined, result)

    def _value(self, part: JoinPart, entry: list[Any]) -> Any:
        # Recovered from the changelog: decoded on first use.
        value = entry[3] = self._decode[entry[6]](entry[2])
        return value

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

    def hand_over(self, partition: int, to: JoinStore) -> None:
        """Move ``partition``'s buffers to ``to``, a store of the same join: a standby
        copy becomes the owner's state (the objects, not a copy of them)."""
        to.parts[partition] = self.parts.pop(partition)

    def reset(self, partition: int) -> None:
        """Forget ``partition``'s buffers (they are rebuilt from the changelog)."""
        self.revoke([partition])
        self.assign([partition])

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain: (partition, key, value or None)."""
        out: list[tuple[int, bytes, bytes | None]] = []
        for p, part in self.parts.items():
            if part.recovered is not None:
                self._rebuild(part)
            for entry in part.dirty:
                flags = entry[7]
                if flags & GONE:
                    entry[7] = flags & ~(DIRTY | LOGGED)
                    if not flags & LOGGED:
                        continue  # came and went between two checkpoints
                    value: bytes | None = None
                else:
                    entry[7] = (flags & ~DIRTY) | LOGGED
                    value = _encode((entry[0], entry[1], entry[2]))
                out.append((p, _encode((entry[6], entry[4], entry[5])), value))
            part.dirty = []
            # As of the last record done: one whose results are still being handed out
            # is processed again after a restart, so its time must not count yet.
            state = (part.done, part.high[0], part.high[1])
            if state != part.logged:
                part.logged = state
                out.append((p, TIME_KEY, _encode(state)))
        return out

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild ``partition``'s buffers from its changelog (called once per fetched
        batch of it; the buffers are rebuilt when the partition is first used)."""
        self.assign([partition])
        part = self.parts[partition]
        found = self._recovering(part)
        for m in messages:
            parsed = self._parse(m)
            if parsed is not None:
                self._recover(part, found, *parsed)

    @staticmethod
    def _recovering(part: JoinPart) -> dict[tuple[int, bytes, int], list[Any]]:
        """``part``'s entries by (side, key, offset), where the changelog's latest record
        of each wins: made into the buffers when the partition is first used."""
        found = part.recovered
        if found is None:
            found = part.recovered = {
                (e[6], e[4], e[5]): e
                for by_key in part.buffers
                for es in by_key.values()
                for e in es
            }
        return found

    def _parse(self, m: Message) -> tuple[Any, Any] | None:
        """A changelog record as (TIME_KEY, state or None) or ((side, key, offset), entry
        or None); None for a record (in ``rejected``) without a key or not this join's."""
        if m.key is None:
            self.rejected.append((m, keyless()))
            return None
        # Checked: anyone who may write the changelog may write anything there, and a
        # record the join cannot hold must not stop its recovery. The worker dead-letters it.
        try:
            if m.key == TIME_KEY:
                if m.value is None:
                    return TIME_KEY, None
                state = _state_decoder.decode(m.value)
                return TIME_KEY, (state, -1, -1) if isinstance(state, int) else state
            ref = _key_decoder.decode(m.key)
            if ref[0] not in (LEFT, RIGHT):
                raise msgspec.ValidationError(f"side {ref[0]} is neither 0 nor 1")
            return ref, None if m.value is None else _entry_decoder.decode(m.value)
        except DECODE_FAILURES as exc:
            error = f"not a changelog record of this join: {decode_error_message(exc)}"
            self.rejected.append((m, DecodeError(error)))
            return None

    @staticmethod
    def _recover(
        part: JoinPart, found: dict[tuple[int, bytes, int], list[Any]], ref: Any, record: Any
    ) -> None:
        """Apply one parsed changelog record (``_parse``) to ``part`` being recovered."""
        if ref == TIME_KEY:
            if record is not None:
                part.logged = record
                part.time = part.done = record[0]
                part.high = [record[1], record[2]]
                part.replayed = (record[1], record[2])
        elif record is None:
            found.pop(ref, None)
        else:
            ts, matched, raw = record
            found[ref] = [ts, matched, raw, None, ref[1], ref[2], ref[0], LOGGED]

    def _rebuild(self, part: JoinPart) -> None:
        """The buffers, deques and due time of what the changelog held."""
        assert part.recovered is not None
        ordered = sorted(part.recovered.values(), key=lambda e: (e[0], e[6], e[5]))
        part.recovered = None
        if part.time != NONE and not self.trusts(part.time, part.number):
            # Beyond the guard: it would make every record late. It starts again from
            # what is buffered (every buffered record was read, so stream time is past it).
            part.time = part.done = ordered[-1][0] if ordered else NONE
        part.buffers = ({}, {})
        part.expiring = deque(ordered)
        part.closing = (deque(), deque())
        part.late = ([], [], [])
        for e in ordered:
            part.buffers[e[6]].setdefault(e[4], []).append(e)
            if self._emits_unmatched[e[6]] and not e[1]:
                part.closing[e[6]].append(e)
        part.close_due = part.expire_due = NEVER
        self._close_windows(part, NONE)  # nothing closes: the due times only
        self._expire(part, NONE)
        part.due = min(part.close_due, part.expire_due)
