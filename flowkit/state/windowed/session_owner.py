"""Stage 2 of a session table: the owning partition merges the sessions its sources
closed, and closes the merged sessions.

Each source partition sends a session of a key when it closed there, as a piece
``(source, start) -> [end, value]``, with the lowest watermark that closes it (``end +
gap + 1``; the pieces a source closes go in end order); with running updates it also
sends its open sessions at every flush, with its watermark then. The owner merges
a piece with the key's open sessions within ``gap`` of it (a key's records may come from
several partitions), and closes a
session once every source's watermark minus ``gap`` has passed its end: its value (the
pieces folded in time order) is emitted once, with its final bounds, then stays readable
until ``expires``. A piece sent again (a replay after a restart) replaces itself; one for
a session already closed is ignored.

>>> import operator
>>> from flowkit.windows import SessionWindow
>>> from flowkit.records import Message
>>> owners = SessionOwners(SessionWindow(10, grace=0), sources=2, combine=operator.add)
>>> owners.assign([0])
>>> def rec(v): return Message("t", 0, 0, 0, None, v)
>>> owners.receive(0, [rec(wire.partial(0, 0, "k", [4_000, 2, 20_000])),  # [0, 4 s] from 0
...                    rec(wire.partial(9_000, 1, "k", [9_000, 1, 20_000])),  # [9 s] from 1
...                    rec(wire.marker(30_000, 0)), rec(wire.marker(30_000, 1))])
[('k', Window(start=0, end=9000), 3)]
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from ...errors import DecodeError
from ...records import Message
from ...streamtime import FutureGuard
from ...windows import SessionSpec, Window
from ..refusals import valueless
from . import wire
from .session_source import index_of
from .stages import NONE, Change, Emission, OwnersBase

__all__ = ["OpenSession", "SessionOwner", "SessionOwners"]

log = structlog.get_logger(__name__)

OpenSession = list[Any]
"""``[start, end, {(source, piece start): [piece end, value, running]}]``: ``running``
for a running update's copy of a session still open on its source (sent with the
source's watermark then, at most ``end + gap``), which may have grown there since; a
session holding one does not close here until the source's final piece replaces it."""


class SessionOwner:
    """Stage-2 state of one owning partition of a session table."""

    __slots__ = (
        "closed",
        "closing",
        "dirty",
        "dirty_closed",
        "emitted_through",
        "expiring",
        "logged_wm",
        "open",
        "source_wm",
    )

    def __init__(self, sources: int) -> None:
        self.open: dict[Any, list[OpenSession]] = {}  # key -> open sessions, by start
        self.closed: dict[Any, list[list[Any]]] = {}  # key -> [start, end, final value]
        self.source_wm: list[int] = [NONE] * sources
        self.logged_wm: list[int] = [NONE] * sources  # as the changelog last had them
        self.closing: list[tuple[int, int, Any, int]] = []  # (end, n, key, start), lazy
        self.expiring: list[tuple[int, int, Any, int]] = []  # (end, n, key, start)
        # Keys whose open, or closed, sessions changed since the last changelog flush.
        self.dirty: set[Any] = set()
        self.dirty_closed: set[Any] = set()
        self.emitted_through = -1  # as Owner's


def value_of(session: OpenSession, combine: Callable[[Any, Any], Any]) -> Any:
    """An open session's value: its pieces folded in time order."""
    pieces = sorted(session[2].items(), key=lambda item: (item[0][1], item[0][0]))
    total = pieces[0][1][1]
    for _, piece in pieces[1:]:
        total = combine(total, piece[1])
    return total


class SessionOwners(OwnersBase[SessionOwner]):
    """One worker's stage-2 state of one session table: the partitions it owns
    (``OwnersBase``), each a ``SessionOwner`` of its keys' sessions."""

    def __init__(
        self,
        spec: SessionSpec,
        *,
        sources: int,
        combine: Callable[[Any, Any], Any],
        name: str = "table",
        guard: FutureGuard | None = None,
        updates: bool = False,
    ) -> None:
        super().__init__(SessionOwner, sources=sources, name=name, guard=guard, updates=updates)
        self.spec = spec
        self.gap = spec.gap_ms
        self.combine = combine
        self._n = itertools.count()

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Apply pieces and markers that arrived on repartition partition ``q``; return
        the sessions that closed, earliest end first."""
        owner = self.owner_of(q)
        out: list[Emission] = []
        moved = False  # a piece was merged: it may close at once
        replays = future = 0
        guard = self.guard
        touched: dict[tuple[Any, int], None] = {}  # (key, start) of sessions that changed
        gap = self.gap
        close_time = min(owner.source_wm) - gap  # what ends before it is closed here
        for m in messages:
            if m.value is None:
                self.rejected.append((m, valueless()))
                continue
            try:
                kind, a, src, key, value = wire.decode_record(
                    m.value, len(owner.source_wm), guard=guard
                )
                if kind == "p":
                    end, piece, wm = _piece(value, a)
                    if guard is not None and end > guard.future_limit and not guard.admits(end):
                        raise DecodeError(f"not a repartition record: {wire.too_far(guard, end)}")
            except DecodeError as exc:
                self.rejected.append((m, exc))
                continue
            if kind == "w":
                wm = a
            elif wm < owner.source_wm[src] or (
                end < close_time and self._covered(owner, key, a, end)
            ):
                # A replay after a restart: the source's watermark was already past
                # it, or its session closed here already.
                replays += 1
                continue
            if kind == "p":
                if moved:
                    sessions = owner.open.get(key)
                    if sessions and sessions[0][1] < close_time:
                        # A session of this key that a watermark had closed already (one
                        # that came with an earlier piece): it closes before this piece
                        # can join it, as on its source, where it had closed first.
                        out.extend(self._close(owner))
                        moved = False
                # A final piece comes with the watermark that closed it (end + gap + 1),
                # a running update's with its source's watermark then (at most end + gap).
                merged = self._merge(owner, key, src, a, end, piece, wm <= end + gap)
                if merged is not None:
                    moved = True
                    if self.updates:
                        touched[key, merged] = None
            if wm > owner.source_wm[src]:
                if guard is not None and wm > guard.future_limit and not guard.admits(wm):
                    future += 1
                    continue
                # A piece carries the watermark that closed it at its source: what that
                # watermark closes here closes now, before a later session of the same
                # source can join it (as there, where it had closed first).
                owner.source_wm[src] = wm
                close_time = min(owner.source_wm) - gap
                out.extend(self._close(owner))
                moved = False
        if replays:
            self.replays_ignored += replays
            log.debug("sessions already closed ignored (a replay)", table=self.name, count=replays)
        if future:
            log.warning(
                "watermark markers beyond max_future ignored",
                table=self.name,
                partition=q,
                count=future,
            )
        if moved:
            out.extend(self._close(owner))
        if touched:
            # After the closes: a session that closed in this batch has its final value
            # out, and no running update; one merged into another since is that one's.
            combine = self.combine
            for key, start in touched:
                sessions = owner.open.get(key)
                k = -1 if sessions is None else index_of(sessions, start)
                if k >= 0:
                    s = sessions[k]  # type: ignore[index]
                    self._updates.append((key, Window(s[0], s[1]), value_of(s, combine)))
        return out

    def _merge(
        self,
        owner: SessionOwner,
        key: Any,
        src: int,
        start: int,
        end: int,
        v: Any,
        running: bool = False,
    ) -> int | None:
        """Merge a piece into ``key``'s open sessions; the start of the session that holds
        it, or None when it only replaced an equal piece (nothing changed)."""
        gap = self.gap
        sessions = owner.open.setdefault(key, [])
        owner.dirty.add(key)
        i = 0
        while i < len(sessions) and sessions[i][1] + gap < start:
            i += 1
        j = i
        pieces: dict[tuple[int, int], list[Any]] = {}
        while j < len(sessions) and sessions[j][0] - gap <= end:
            pieces.update(sessions[j][2])
            j += 1
        # A piece of the same source that overlaps this one is an earlier version of it
        # (a replay, or a running update of a session still open there): a source's
        # sessions of one key never overlap, and each only grows until it closes.
        older = [
            pid
            for pid, piece in pieces.items()
            if pid[0] == src and pid[1] <= end and start <= piece[0]
        ]
        new = [end, v, running]
        unchanged = j == i + 1 and older == [(src, start)] and pieces[older[0]] == new
        for pid in older:
            del pieces[pid]
        pieces[(src, start)] = new
        if unchanged:
            sessions[i][2] = pieces
            return None
        lo = min(ps for _, ps in pieces)
        hi = max(piece[0] for piece in pieces.values())
        before = sessions[i][0] if i < j else None
        sessions[i:j] = [[lo, hi, pieces]]
        if lo != before or not running:
            # (A final piece also: its session may have been passed over while a running
            # copy held it open; the close order is lazy, an entry more is harmless.)
            heapq.heappush(owner.closing, (hi, next(self._n), key, lo))
        return lo

    def _close(self, owner: SessionOwner) -> list[Emission]:
        close_time = min(owner.source_wm) - self.gap
        closing = owner.closing
        out: list[Emission] = []
        while closing and closing[0][0] < close_time:
            _, _, key, start = heapq.heappop(closing)
            sessions = owner.open.get(key)
            if not sessions:
                continue
            k = index_of(sessions, start)
            if k < 0:
                continue
            session = sessions[k]
            end = session[1]
            if end >= close_time:
                heapq.heappush(closing, (end, next(self._n), key, start))
                continue
            if any(piece[2] for piece in session[2].values()):
                continue  # open on a source still: its final piece comes, and closes it
            del sessions[k]
            if not sessions:
                del owner.open[key]
            total = value_of(session, self.combine)
            out.append((key, Window(start, end), total))
            self.keep_closed(owner, key, start, end, total)
            owner.dirty.add(key)
            owner.dirty_closed.add(key)
            self.closed_windows += 1
        self.expire(owner, close_time - self.spec.expires_ms)
        return out

    # -- closed sessions: in memory here, on disk in ``session_disk_owner.py`` -------------

    def keep_closed(self, owner: SessionOwner, key: Any, start: int, end: int, total: Any) -> None:
        """Keep a session that closed readable, until it expires."""
        owner.closed.setdefault(key, []).append([start, end, total])
        heapq.heappush(owner.expiring, (end, next(self._n), key, start))

    def expire(self, owner: SessionOwner, expire_time: int) -> None:
        """Forget the closed sessions that end before ``expire_time``."""
        expiring = owner.expiring
        while expiring and expiring[0][0] < expire_time:
            _, _, key, start = heapq.heappop(expiring)
            kept = [s for s in owner.closed.get(key, ()) if s[0] != start]
            if kept:
                owner.closed[key] = kept
            else:
                owner.closed.pop(key, None)
            owner.dirty_closed.add(key)

    def closed_of(self, owner: SessionOwner, key: Any) -> list[list[Any]]:
        """``key``'s closed sessions, ``[start, end, value]`` each (until they expire)."""
        return owner.closed.get(key, [])

    def closed_record(self, owner: SessionOwner, key: Any) -> bytes | None:
        """The changelog value of ``key``'s closed sessions (None: it has none)."""
        closed = owner.closed.get(key)
        return wire.encode(closed) if closed else None

    def set_closed(self, owner: SessionOwner, key: Any, closed: list[list[Any]] | None) -> None:
        """Replace ``key``'s closed sessions (a changelog record; None: none)."""
        if closed is None:
            owner.closed.pop(key, None)
        else:
            owner.closed[key] = closed

    def closed_keys(self, owner: SessionOwner) -> Iterable[Any]:
        """The keys with closed sessions."""
        return owner.closed

    def drain_changes_into(self, out: list[Change]) -> None:
        """Append stage 2's changelog records since the last drain to ``out``: each
        changed key's open and closed sessions whole (None when none are left), and the
        sources' watermarks."""
        for q, owner in self.owners.items():
            self._drain_owner(q, owner, out)

    def _drain_owner(self, q: int, owner: SessionOwner, out: list[Change]) -> None:
        for key in owner.dirty:
            sessions = owner.open.get(key)
            opened = None
            if sessions:
                opened = [
                    [s, e, [_logged(src, ps, piece) for (src, ps), piece in pieces.items()]]
                    for s, e, pieces in sessions
                ]
            out.append(
                (q, wire.encode(("O", key)), None if opened is None else wire.encode(opened))
            )
        owner.dirty.clear()
        for key in owner.dirty_closed:
            out.append((q, wire.encode(("C", key)), self.closed_record(owner, key)))
        owner.dirty_closed.clear()
        for src, wm in enumerate(owner.source_wm):
            if wm != owner.logged_wm[src]:
                owner.logged_wm[src] = wm
                out.append((q, wire.source_key(src), wire.encode(wm)))

    def apply_record(self, owner: SessionOwner, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2 (``kind`` "s", "e", "O" or "C")."""
        if kind == "e":
            self.apply_emitted(owner, value)
            return
        if kind == "s":
            owner.source_wm[parts[1]] = value if value is not None else NONE
            owner.logged_wm[parts[1]] = owner.source_wm[parts[1]]
            return
        key = wire.key_from_json(parts[1])
        if kind == "O":
            if value is None:
                owner.open.pop(key, None)
            else:
                owner.open[key] = [[s, e, dict(map(_unlogged, pieces))] for s, e, pieces in value]
        else:
            self.set_closed(owner, key, None if value is None else [list(s) for s in value])

    def recovered(self, owner: SessionOwner, partition: int) -> None:
        """Rebuild ``owner``'s close and expiry order after its changelog was applied."""
        self.trust_watermarks(owner, partition)
        owner.closing = [
            (s[1], next(self._n), key, s[0]) for key, ss in owner.open.items() for s in ss
        ]
        heapq.heapify(owner.closing)
        owner.expiring = [
            (s[1], next(self._n), key, s[0]) for key, ss in owner.closed.items() for s in ss
        ]
        heapq.heapify(owner.expiring)

    def _covered(self, owner: SessionOwner, key: Any, start: int, end: int) -> bool:
        """True when a closed session of ``key`` covers ``[start, end]``."""
        return any(s[0] <= start and end <= s[1] for s in owner.closed.get(key, ()))


def _logged(src: int, start: int, piece: list[Any]) -> list[Any]:
    # A piece in the changelog: [source, start, end, value], and a 1 after for a running
    # update's copy (so that records written before the flag existed read as final).
    end, value, running = piece
    return [src, start, end, value, 1] if running else [src, start, end, value]


def _unlogged(piece: list[Any]) -> tuple[tuple[int, int], list[Any]]:
    # ``_logged``'s inverse; ``DecodeError`` for anything else (anyone may write there).
    if not 4 <= len(piece) <= 5 or any(type(n) is not int for n in piece[:3]):
        raise DecodeError("not a changelog record: a piece is [source, start, end, value]")
    if len(piece) == 5 and piece[4] != 1:
        raise DecodeError("not a changelog record: a piece's running flag is 1")
    src, start, end, value = piece[:4]
    return (src, start), [end, value, len(piece) == 5]


def _piece(value: Any, start: int) -> tuple[int, Any, int]:
    # A piece's value on the wire is [end, value, watermark]; anything else is not one.
    if (
        not isinstance(value, list)
        or len(value) != 3
        or type(value[0]) is not int
        or type(value[2]) is not int
    ):
        raise DecodeError("not a repartition record: a session piece is [end, value, watermark]")
    end, piece, wm = value
    if end < start:
        raise DecodeError("not a repartition record: a session ends before it starts")
    return end, piece, wm
