"""Stage 2 of a windowed table: the owning partition combines partials and closes windows.

Partials arrive from every source partition through the repartition topic, one per window,
key and source (a replayed partial replaces, never adds). Markers carry each source's
watermark; a window closes when every source's watermark has passed its end, and its
final value per key is emitted once, then stays readable until ``expires``.

>>> import operator
>>> from flowkit.windows import TumblingWindow
>>> from flowkit.records import Message
>>> owners = Owners(TumblingWindow(10, grace=0), sources=1, combine=operator.add)
>>> owners.assign([0])
>>> def rec(v): return Message("t", 0, 0, 0, None, v)
>>> owners.receive(0, [rec(wire.partial(0, 0, "k", 3)), rec(wire.marker(10_000, 0))])
[('k', Window(start=0, end=10000), 3)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from ...errors import DecodeError, NotRunningError
from ...records import Message
from ...streamtime import FutureGuard
from ...windows import Window, WindowSpec
from . import wire
from .stage1 import NONE

__all__ = ["Emission", "Owner", "Owners", "fold", "fold_sources"]

log = structlog.get_logger(__name__)

Emission = tuple[Any, Window, Any]
"""(key, window, final value) of a closed window."""


class Owner:
    """Stage-2 state of one owning partition."""

    __slots__ = ("closed", "emitted_through", "open", "source_wm")

    def __init__(self, sources: int) -> None:
        self.open: dict[int, dict[Any, dict[int, Any]]] = {}  # start -> key -> source -> v
        self.closed: dict[int, dict[Any, Any]] = {}  # start -> key -> final value
        self.source_wm: list[int] = [NONE] * sources
        # From the changelog: the last repartition offset whose records closed windows
        # in an earlier run (-1: none).
        self.emitted_through = -1


class Owners:
    """One worker's stage-2 state of one windowed table: the partitions it owns."""

    marks_replays = True

    def __init__(
        self,
        spec: WindowSpec,
        *,
        sources: int,
        combine: Callable[[Any, Any], Any],
        name: str = "table",
        guard: FutureGuard | None = None,
        updates: bool = False,
    ) -> None:
        self.spec = spec
        # Running updates (emit_on="update"): each change of a key's combined value in an
        # open window, collected by receive() for the worker (take_updates).
        self.updates = updates
        self._updates: list[Emission] = []
        # The table's guard on stream time: a marker beyond it is not trusted (a source's
        # watermark comes from the internal topic, which anyone with produce rights can
        # write). None: markers are taken as they come.
        self.guard = guard
        self.sources = sources
        self.combine = combine
        self.name = name
        self.owners: dict[int, Owner] = {}
        self.closed_windows = 0
        self.replays_ignored = 0
        self._changes: list[tuple[int, bytes, bytes | None]] = []
        # Records of the repartition topic that flowkit did not write, with why: the
        # worker dead-letters them (``take_rejected``), and nothing else sees them.
        self.rejected: list[tuple[Message, Exception]] = []

    def take_updates(self) -> list[Emission]:
        """The running updates ``receive`` found since the last call, oldest first."""
        updates, self._updates = self._updates, []
        return updates

    def take_rejected(self) -> list[tuple[Message, Exception]]:
        """The records ``receive`` refused since the last call."""
        rejected, self.rejected = self.rejected, []
        return rejected

    def assign(self, partitions: Iterable[int]) -> None:
        """Start owning these partitions."""
        for p in partitions:
            if p not in self.owners:
                self.owners[p] = Owner(self.sources)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        for p in partitions:
            self.owners.pop(p, None)

    def replayed(self, q: int, messages: Sequence[Message]) -> int:
        """How many of ``messages`` (from partition ``q``, in offset order) an earlier run
        read and closed windows with: the windows they close are emitted again, and marked
        so. The rest closes windows for the first time."""
        owner = self.owners.get(q)
        if owner is None or not messages or messages[0].offset > owner.emitted_through:
            return 0
        return sum(1 for m in messages if m.offset <= owner.emitted_through)

    def emitting(self, q: int, offset: int) -> tuple[bytes, bytes]:
        """The changelog record (key, value) that says records of ``q`` up to ``offset``
        closed windows: acknowledged before their results go out, so a result the broker
        has is marked when a restart emits it again."""
        owner = self.owners.get(q)
        if owner is not None:
            owner.emitted_through = offset
        return wire.EMITTED_KEY, wire.encode(offset)

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Apply partials and markers that arrived on repartition partition ``q``; return
        the windows that closed, oldest first."""
        owner = self.owners.get(q)
        if owner is None:
            raise NotRunningError(f"table {self.name!r}: partition {q} is not held here")
        size = self.spec.size_ms
        changed_wm = False
        replays = future = 0
        guard = self.guard
        sources = len(owner.source_wm)
        touched: dict[tuple[int, Any], None] = {}  # (start, key) whose value changed
        for m in messages:
            if m.value is None:
                continue
            try:
                kind, a, src, key, value = wire.decode_record(m.value, sources)
            except DecodeError as exc:
                self.rejected.append((m, exc))  # the worker dead-letters it
                continue
            if kind == "p":
                start = a
                if start + size <= min(owner.source_wm) or start in owner.closed:
                    replays += 1  # a replay after a restart: the window closed already
                    continue
                by_source = owner.open.setdefault(start, {}).setdefault(key, {})
                if self.updates and by_source.get(src, _MISSING) != value:
                    touched[start, key] = None
                by_source[src] = value
                self._changes.append((q, wire.owned_key(start, key, src), wire.encode(value)))
            elif kind == "w" and a > owner.source_wm[src]:
                if guard is not None and a > guard.future_limit and not guard.admits(a):
                    future += 1  # it would close every window of every key at once
                    continue
                owner.source_wm[src] = a
                changed_wm = True
                self._changes.append((q, wire.source_key(src), wire.encode(a)))
        if replays:
            # One line per batch, not per partial: a restart replays thousands of them.
            self.replays_ignored += replays
            log.debug(
                "partials for closed windows ignored (a replay)", table=self.name, count=replays
            )
        if future:
            log.warning(
                "watermark markers beyond max_future ignored",
                table=self.name,
                partition=q,
                count=future,
            )
        closed = self._close(q, owner) if changed_wm else []
        if touched:
            # After the closes: a window that closed in this batch has its final value
            # out, and no running update of it.
            for start, key in touched:
                by_key = owner.open.get(start)
                if by_key is not None and key in by_key:
                    value = fold_sources(self.combine, by_key[key])
                    self._updates.append((key, self.spec.window(start), value))
        return closed

    def _close(self, q: int, owner: Owner) -> list[Emission]:
        horizon = min(owner.source_wm)
        size = self.spec.size_ms
        out: list[Emission] = []
        changes = self._changes
        for start in sorted(owner.open):
            if start + size > horizon:
                break
            by_key = owner.open.pop(start)
            finals: dict[Any, Any] = {}
            window = self.spec.window(start)
            for key, parts in by_key.items():
                total = fold_sources(self.combine, parts)
                finals[key] = total
                out.append((key, window, total))
                for src in parts:
                    changes.append((q, wire.owned_key(start, key, src), None))
                changes.append((q, wire.closed_key(start, key), wire.encode(total)))
            owner.closed[start] = finals
            self.closed_windows += 1
        for start in list(owner.closed):
            if start + size + self.spec.expires_ms <= horizon:
                for key in owner.closed.pop(start):
                    changes.append((q, wire.closed_key(start, key), None))
        return out

    def drain_changes_into(self, out: list[tuple[int, bytes, bytes | None]]) -> None:
        """Append stage 2's changelog records since the last drain to ``out``."""
        out.extend(self._changes)
        self._changes = []

    def apply_record(self, owner: Owner, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2 (``kind`` "o", "s", "e" or "c")."""
        if kind == "s":
            owner.source_wm[parts[1]] = value if value is not None else NONE
            return
        if kind == "e":
            owner.emitted_through = value if type(value) is int else -1  # not a bool either
            return
        start, key = parts[1], wire.key_from_json(parts[2])
        if kind == "o":
            if value is None:
                owner.open.get(start, {}).pop(key, None)
            else:
                owner.open.setdefault(start, {}).setdefault(key, {})[parts[3]] = value
        elif value is None:
            owner.closed.get(start, {}).pop(key, None)
        else:
            owner.closed.setdefault(start, {})[key] = value

    def recovered(self, owner: Owner, partition: int) -> None:
        """Tidy ``owner`` after its changelog was applied. A source's watermark there
        beyond ``max_future`` is not trusted: the owner waits for that source's next
        marker instead."""
        if self.guard is not None:
            for src, wm in enumerate(owner.source_wm):
                if wm != NONE and not self.guard.trusts(wm, partition):
                    owner.source_wm[src] = NONE
        for d in (owner.open, owner.closed):
            for start in [s for s, v in d.items() if not v]:
                del d[start]


def fold_sources(combine: Callable[[Any, Any], Any], by_source: dict[int, Any]) -> Any:
    """The partials of one key in one window, combined in the order of their source
    partitions (not of their arrival), so that an order-sensitive merge is repeatable."""
    if len(by_source) == 1:
        for value in by_source.values():
            return value
    return fold(combine, [by_source[src] for src in sorted(by_source)])


def fold(combine: Callable[[Any, Any], Any], values: Iterable[Any]) -> Any:
    """``values`` combined left to right."""
    it = iter(values)
    total = next(it)
    for v in it:
        total = combine(total, v)
    return total


_MISSING: Any = object()
