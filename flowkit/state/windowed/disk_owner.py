"""Stage 2 of a tumbling or hopping table on disk (``rocksdb://``): the owner's partials
and closed windows live in the partition's database (``disk.py``), not in memory.

The rules are ``owner.py``'s, record for record: a partial replaces its source's, a window
closes once every source's watermark has passed its end, its final values stay readable
until ``expires``. What stays in memory per owned partition is small: the sources'
watermarks, the last offset that closed windows, and the starts of the windows held.
Closing a window reads its partials in one prefix scan and deletes them in one range
delete; expiring a closed window is one range delete too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import structlog

from ...errors import DecodeError
from ...records import Message
from ...streamtime import FutureGuard
from ...windows import WindowSpec
from ..refusals import valueless
from . import disk, wire
from .disk import CLOSED, EMITTED, OWNED, SOURCE_WM, DiskPart
from .owner import fold_sources
from .stages import NONE, Emission, OwnersBase

__all__ = ["DiskOwner", "DiskOwners"]

log = structlog.get_logger(__name__)

_decode = wire.decode


class DiskOwner:
    """Stage-2 state of one owning partition: what is small, in memory; the rest on disk."""

    __slots__ = ("closed_starts", "disk", "emitted_through", "open_starts", "source_wm")

    def __init__(self, sources: int, part: DiskPart | None = None) -> None:
        self.source_wm: list[int] = [NONE] * sources
        self.emitted_through = -1
        self.open_starts: set[int] = set()  # windows with partials here
        self.closed_starts: set[int] = set()  # closed windows, until they expire
        self.disk: DiskPart = part  # type: ignore[assignment]  # set by the store


class DiskOwners(OwnersBase[DiskOwner]):
    """One worker's stage-2 state of one tumbling or hopping table on disk: the
    partitions it owns, each a ``DiskOwner`` over its partition's database."""

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
        super().__init__(DiskOwner, sources=sources, name=name, guard=guard, updates=updates)
        self.spec = spec
        self.combine = combine
        self._changes: list[tuple[int, bytes, bytes | None]] = []

    def assign(self, partitions: Iterable[int]) -> None:
        """Nothing: the store opens each partition's database and ``attach``es it."""

    def attach(self, q: int, part: DiskPart) -> DiskOwner:
        """Own partition ``q`` with the state in ``part`` (its database, opened)."""
        owner = self.owners.get(q)
        if owner is None:
            owner = self.owners[q] = DiskOwner(self.sources)
        owner.disk = part
        raw = part.get(EMITTED)
        if raw is not None:
            self.apply_emitted(owner, _decode(raw))
        for src in range(self.sources):
            raw = part.get(SOURCE_WM + disk.source(src))
            if raw is not None:
                owner.source_wm[src] = _decode(raw)
        owner.open_starts = part.starts(OWNED)
        owner.closed_starts = part.starts(CLOSED)
        return owner

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Apply partials and markers that arrived on repartition partition ``q``; return
        the windows that closed, oldest first."""
        owner = self.owner_of(q)
        part = owner.disk
        size = self.spec.size_ms
        changed_wm = False
        replays = future = 0
        guard = self.guard
        sources = len(owner.source_wm)
        touched: dict[tuple[int, Any], None] = {}
        for m in messages:
            if m.value is None:
                self.rejected.append((m, valueless()))
                continue
            try:
                kind, a, src, key, value = wire.decode_record(m.value, sources)
                if kind == "p":
                    at = disk.start(a)
            except DecodeError as exc:
                self.rejected.append((m, exc))  # the worker dead-letters it
                continue
            if kind == "p":
                start = a
                if start + size <= min(owner.source_wm) or start in owner.closed_starts:
                    replays += 1  # a replay after a restart: the window closed already
                    continue
                encoded = wire.encode(value)
                dk = OWNED + at + wire.encode(key) + disk.source(src)
                if self.updates and part.get(dk) != encoded:
                    touched[start, key] = None
                part.put(dk, encoded)
                owner.open_starts.add(start)
                self._changes.append((q, wire.owned_key(start, key, src), encoded))
            elif kind == "w" and a > owner.source_wm[src]:
                if guard is not None and a > guard.future_limit and not guard.admits(a):
                    future += 1
                    continue
                owner.source_wm[src] = a
                changed_wm = True
                encoded = wire.encode(a)
                part.put(SOURCE_WM + disk.source(src), encoded)
                self._changes.append((q, wire.source_key(src), encoded))
        if replays:
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
        for start, key in touched:
            if start in owner.open_starts:
                parts = self.parts_of(owner, start, key)
                if parts:
                    self._updates.append(
                        (key, self.spec.window(start), fold_sources(self.combine, parts))
                    )
        return closed

    def parts_of(self, owner: DiskOwner, start: int, key: Any) -> dict[int, Any]:
        """The partials of ``key`` in the open window at ``start``, by source."""
        prefix = OWNED + disk.start(start) + wire.encode(key)
        out: dict[int, Any] = {}
        for src in range(self.sources):
            raw = owner.disk.get(prefix + disk.source(src))
            if raw is not None:
                out[src] = _decode(raw)
        return out

    def final_of(self, owner: DiskOwner, start: int, key: Any) -> tuple[bool, Any]:
        """(True, the final value) of ``key`` in the closed window at ``start``, or
        (False, None)."""
        raw = owner.disk.get(CLOSED + disk.start(start) + wire.encode(key))
        return (False, None) if raw is None else (True, _decode(raw))

    def _close(self, q: int, owner: DiskOwner) -> list[Emission]:
        horizon = min(owner.source_wm)
        size = self.spec.size_ms
        out: list[Emission] = []
        changes = self._changes
        part = owner.disk
        for start in sorted(owner.open_starts):
            if start + size > horizon:
                break
            owner.open_starts.discard(start)
            window = self.spec.window(start)
            group = OWNED + disk.start(start)
            closed = CLOSED + disk.start(start)
            for key, parts in _by_key(part.scan(group)):
                total = fold_sources(self.combine, parts)
                out.append((key, window, total))
                for src in parts:
                    changes.append((q, wire.owned_key(start, key, src), None))
                encoded = wire.encode(total)
                changes.append((q, wire.closed_key(start, key), encoded))
                part.put(closed + wire.encode(key), encoded)
            part.drop(group)
            owner.closed_starts.add(start)
            self.closed_windows += 1
        for start in sorted(owner.closed_starts):
            if start + size + self.spec.expires_ms > horizon:
                continue
            group = CLOSED + disk.start(start)
            for raw_key, _ in part.scan(group):
                key = wire.key_from_json(_decode(raw_key[9:]))
                changes.append((q, wire.closed_key(start, key), None))
            part.drop(group)
            owner.closed_starts.discard(start)
        return out

    def drain_changes_into(self, out: list[tuple[int, bytes, bytes | None]]) -> None:
        """Append stage 2's changelog records since the last drain to ``out``."""
        out.extend(self._changes)
        self._changes = []

    def emitting(self, q: int, offset: int) -> tuple[bytes, bytes]:
        """As ``OwnersBase.emitting``, and on disk at the next persist: the record is
        sent (and acknowledged) outside the drains, so it joins the drained changes."""
        key, value = super().emitting(q, offset)
        owner = self.owners.get(q)
        if owner is not None:
            owner.disk.draining.put(EMITTED, value)
        return key, value

    def apply_record(self, owner: DiskOwner, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2 (``kind`` "o", "s", "e" or "c")."""
        encoded = None if value is None else wire.encode(value)
        part = owner.disk
        if kind == "s":
            owner.source_wm[parts[1]] = value if value is not None else NONE
            part.put(SOURCE_WM + disk.source(parts[1]), encoded)
            return
        if kind == "e":
            self.apply_emitted(owner, value)
            part.put(EMITTED, wire.encode(owner.emitted_through))
            return
        start = parts[1]
        kj = wire.encode(parts[2])
        if kind == "o":
            part.put(OWNED + disk.start(start) + kj + disk.source(parts[3]), encoded)
            if value is not None:
                owner.open_starts.add(start)
        else:
            part.put(CLOSED + disk.start(start) + kj, encoded)
            if value is not None:
                owner.closed_starts.add(start)

    def recovered(self, owner: DiskOwner, partition: int) -> None:
        """Tidy ``owner`` after its changelog was applied: watermarks beyond
        ``max_future`` are not trusted; windows left with no keys are forgotten."""
        self.trust_watermarks(owner, partition)
        part = owner.disk
        for kind, starts in ((OWNED, owner.open_starts), (CLOSED, owner.closed_starts)):
            for start in list(starts):
                if next(part.scan(kind + disk.start(start)), None) is None:
                    starts.discard(start)


def _by_key(entries: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[Any, dict[int, Any]]]:
    """The partials of one window's prefix scan, grouped by key (a key's entries are
    next to each other: see ``disk.py``)."""
    current = b""
    parts: dict[int, Any] = {}
    for raw_key, raw in entries:
        kj = raw_key[9:-4]
        if kj != current:
            if parts:
                yield wire.key_from_json(_decode(current)), parts
            current, parts = kj, {}
        parts[int.from_bytes(raw_key[-4:], "big")] = _decode(raw)
    if parts:
        yield wire.key_from_json(_decode(current)), parts
