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

from ...errors import DecodeError
from ...records import Message
from ...streamtime import FutureGuard
from ...windows import WindowSpec
from ..refusals import valueless
from . import wire
from .stages import NONE, Emission, OwnersBase

__all__ = ["Emission", "Owner", "Owners", "fold", "fold_sources"]

log = structlog.get_logger(__name__)


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


class Owners(OwnersBase[Owner]):
    """One worker's stage-2 state of one tumbling or hopping table: the partitions it
    owns (``OwnersBase``), each an ``Owner`` of open windows' partials."""

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
        super().__init__(Owner, sources=sources, name=name, guard=guard, updates=updates)
        self.spec = spec
        self.combine = combine
        self._changes: list[tuple[int, bytes, bytes | None]] = []

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Apply partials and markers that arrived on repartition partition ``q``; return
        the windows that closed, oldest first."""
        owner = self.owner_of(q)
        size = self.spec.size_ms
        changed_wm = False
        replays = future = 0
        guard = self.guard
        sources = len(owner.source_wm)
        touched: dict[tuple[int, Any], None] = {}  # (start, key) whose value changed
        for m in messages:
            if m.value is None:
                self.rejected.append((m, valueless()))
                continue
            try:
                kind, a, src, key, value = wire.decode_record(m.value, sources, guard=guard)
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
        """Apply one decoded changelog record of stage 2 (``kind`` "o", "s", "e", "c" or
        "k")."""
        if kind == "s":
            owner.source_wm[parts[1]] = value if value is not None else NONE
            return
        if kind == "e":
            self.apply_emitted(owner, value)
            return
        if kind == "k":
            return  # the disk store's close in steps: the memory store closes at once
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
        self.trust_watermarks(owner, partition)
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
