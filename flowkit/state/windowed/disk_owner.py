"""Stage 2 of a tumbling or hopping table on disk (``rocksdb://``): the owner's partials
and closed windows live in the partition's database (``disk.py``), not in memory.

The rules are ``owner.py``'s, record for record: a partial replaces its source's, a window
closes once every source's watermark has passed its end, its final values stay readable
until ``expires``. What stays in memory per owned partition is small: the sources'
watermarks, the last offset that closed windows, and the starts of the windows held.

A window whose end every source's watermark has passed closes in steps, not in
``receive``: each ``step`` reads at most ``close_chunk`` keys of the partition's oldest
closing window (in key order, from where the last step ended) and gives their results;
the worker first writes the step's ``cursor`` (the last key it closes) to the changelog
and waits for it, then sends the results, then ``stepped`` puts the step's changes (each
key's final value, its partials deleted) into the database and the changelog records,
which the checkpoint that ran the step writes. One step per checkpoint: what a close holds
in memory is one chunk's. After a crash the window is still closing (its end is behind
the recovered watermarks) and its keys not yet written as closed close again, marked as
replayed up to the cursor, fresh after it. A closed window expires in steps too.
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
from .disk import CLOSED, CURSOR, EMITTED, OWNED, SOURCE_WM, DiskPart
from .owner import fold_sources
from .stages import NONE, Change, Emission, OwnersBase

__all__ = ["CloseStep", "DiskOwner", "DiskOwners"]

log = structlog.get_logger(__name__)

_decode = wire.decode


class DiskOwner:
    """Stage-2 state of one owning partition: what is small, in memory; the rest on disk."""

    __slots__ = (
        "closed_starts",
        "cursor",
        "disk",
        "emitted_through",
        "expire_at",
        "open_starts",
        "resume",
        "source_wm",
    )

    def __init__(self, sources: int, part: DiskPart | None = None) -> None:
        self.source_wm: list[int] = [NONE] * sources
        self.emitted_through = -1
        self.open_starts: set[int] = set()  # windows with partials here (or closing)
        self.closed_starts: set[int] = set()  # windows closed (or closing), until they expire
        self.disk: DiskPart = part  # type: ignore[assignment]  # set by the store
        # The ``o`` key (start and key, no source) of the last result a step sent: up to
        # it, a key that closes again after a crash may have gone out already.
        self.cursor = b""
        # Per closing (expiring) window: where its next step reads from.
        self.resume: dict[int, bytes] = {}
        self.expire_at: dict[int, bytes] = {}


class CloseStep:
    """One step of an owned partition's close: the results to send (``again``: keys a
    run before a crash may have sent, up to the cursor; ``fresh``: the others), the
    cursor to write first, and what ``stepped`` writes once the results are sent."""

    __slots__ = (
        "again",
        "changes",
        "closed",
        "cursor",
        "expire_at",
        "expired",
        "fresh",
        "q",
        "resume",
        "writes",
    )

    def __init__(self, q: int) -> None:
        self.q = q
        self.again: list[Emission] = []
        self.fresh: list[Emission] = []
        self.cursor = b""  # the ``o`` key of the last result (b"": no result)
        self.changes: list[Change] = []
        self.writes: list[tuple[bytes, bytes | None]] = []
        self.resume: dict[int, bytes] = {}  # per window: where the next step reads from
        self.closed: list[int] = []  # windows whose last key this step closes
        self.expired: list[int] = []  # windows whose last key this step expires
        self.expire_at: dict[int, bytes] = {}  # per window: where the next step expires from


class DiskOwners(OwnersBase[DiskOwner]):
    """One worker's stage-2 state of one tumbling or hopping table on disk: the
    partitions it owns, each a ``DiskOwner`` over its partition's database."""

    stepwise = True
    close_chunk = 10_000
    """How many keys one ``step`` closes (or expires) in one owned partition: the most a
    window's close holds in memory at once."""

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
        raw = part.get(CURSOR)
        if raw is not None:
            self._apply_cursor(owner, _decode(raw))
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
                kind, a, src, key, value = wire.decode_record(m.value, sources, guard=guard)
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
        del changed_wm  # closes go in steps (``step``)
        horizon = min(owner.source_wm)
        for start, key in touched:
            if start in owner.open_starts and start + size > horizon:  # not closing
                parts = self.parts_of(owner, start, key)
                if parts:
                    self._updates.append(
                        (key, self.spec.window(start), fold_sources(self.combine, parts))
                    )
        return []

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

    # -- the close in steps ---------------------------------------------------------------

    def closing(self) -> bool:
        """True while an owned partition has a window to close or to expire."""
        return any(self._closing(owner) for owner in self.owners.values())

    def _closing(self, owner: DiskOwner) -> bool:
        horizon = min(owner.source_wm)
        size = self.spec.size_ms
        if any(start + size <= horizon for start in owner.open_starts):
            return True
        gone = size + self.spec.expires_ms
        return any(
            start + gone <= horizon and start not in owner.open_starts
            for start in owner.closed_starts
        )

    def step(self, q: int) -> CloseStep | None:
        """The next step of partition ``q``'s close: up to ``close_chunk`` keys of its
        closing windows, oldest window first, each window in key order; then, with what
        is left of the chunk, keys of the windows expiring. None: nothing to do."""
        owner = self.owners.get(q)
        if owner is None or not self._closing(owner):
            return None
        step = CloseStep(q)
        horizon = min(owner.source_wm)
        size = self.spec.size_ms
        budget = self.close_chunk
        part = owner.disk
        cursor = owner.cursor
        for start in sorted(owner.open_starts):
            if start + size > horizon or budget <= 0:
                break
            window = self.spec.window(start)
            group = OWNED + disk.start(start)
            closed = CLOSED + disk.start(start)
            n = 0
            entries = part.scan(group, owner.resume.get(start, group))
            for prefix, key, parts in _by_key(entries):
                total = fold_sources(self.combine, parts)
                (step.again if prefix <= cursor else step.fresh).append((key, window, total))
                for src in parts:
                    step.changes.append((q, wire.owned_key(start, key, src), None))
                    step.writes.append((prefix + disk.source(src), None))
                encoded = wire.encode(total)
                step.changes.append((q, wire.closed_key(start, key), encoded))
                step.writes.append((closed + prefix[9:], encoded))
                step.cursor = prefix
                n += 1
                if n == budget:
                    break
            else:
                step.closed.append(start)
            if step.cursor:
                # Past the last key closed: its entries are that key and 4 bytes of a
                # source below 2**24, and a longer key has a JSON character there.
                step.resume[start] = step.cursor + b"\x01"
            budget -= n
        gone = size + self.spec.expires_ms
        for start in sorted(owner.closed_starts):
            if budget <= 0:
                break
            if start + gone > horizon or start in owner.open_starts:
                continue
            group = CLOSED + disk.start(start)
            n = 0
            last = b""
            for raw_key, _ in part.scan(group, owner.expire_at.get(start, group)):
                if n == budget:
                    break
                key = wire.key_from_json(_decode(raw_key[9:]))
                step.changes.append((q, wire.closed_key(start, key), None))
                step.writes.append((raw_key, None))
                last = raw_key
                n += 1
            else:
                step.expired.append(start)
            if last:
                step.expire_at[start] = last + b"\x00"
            budget -= n
        return step

    def cursor_record(self, step: CloseStep) -> tuple[bytes, bytes] | None:
        """The changelog record (key, value) of ``step``'s cursor, to be acknowledged
        before its results go out (None: the step sends no result); on disk at the next
        persist, as ``emitting``'s."""
        owner = self.owners.get(step.q)
        if not step.cursor or owner is None:
            return None
        owner.cursor = step.cursor
        value = wire.encode((disk.start_of(step.cursor), wire.decode(step.cursor[9:])))
        owner.disk.draining.put(CURSOR, value)
        return wire.CURSOR_KEY, value

    def stepped(self, step: CloseStep) -> None:
        """``step``'s results are sent: its keys are closed (or expired), in the
        database at the next persist and in the changelog at the next drain."""
        owner = self.owners.get(step.q)
        if owner is None:
            return  # revoked meanwhile: the next owner closes them again
        part = owner.disk
        for key, value in step.writes:
            part.put(key, value)
        owner.resume.update(step.resume)
        owner.expire_at.update(step.expire_at)
        for start in step.resume:
            owner.closed_starts.add(start)
        for start in step.closed:
            part.drop(OWNED + disk.start(start))
            owner.open_starts.discard(start)
            owner.closed_starts.add(start)
            owner.resume.pop(start, None)
            self.closed_windows += 1
        for start in step.expired:
            part.drop(CLOSED + disk.start(start))
            owner.closed_starts.discard(start)
            owner.expire_at.pop(start, None)
        self._changes.extend(step.changes)

    def holding(self) -> bool:
        """True when the changes waiting for the next checkpoint (partials that arrived,
        a step's) are ``close_chunk`` or more: the worker asks for that checkpoint at
        once, so that the partials of a window shipped whole reach the changelog and the
        disk a chunk at a time, not all in the memory of one checkpoint interval."""
        return len(self._changes) >= self.close_chunk

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
        """Apply one decoded changelog record of stage 2 (``kind`` "o", "s", "e", "c" or
        "k")."""
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
        if kind == "k":
            self._apply_cursor(owner, value)
            part.put(CURSOR, None if value is None else wire.encode(value))
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

    def _apply_cursor(self, owner: DiskOwner, value: Any) -> None:
        # [start, key] from the changelog or the disk (anything else: no cursor).
        try:
            start, key = value
            owner.cursor = OWNED + disk.start(start) + wire.encode(key)
        except (TypeError, ValueError, DecodeError):
            owner.cursor = b""


def _by_key(
    entries: Iterator[tuple[bytes, bytes]],
) -> Iterator[tuple[bytes, Any, dict[int, Any]]]:
    """The partials of one window's prefix scan, grouped by key (a key's entries are
    next to each other: see ``disk.py``): each key's disk prefix (kind, start and key),
    the key, and its partials by source."""
    current = b""
    parts: dict[int, Any] = {}
    for raw_key, raw in entries:
        prefix = raw_key[:-4]
        if prefix != current:
            if parts:
                yield current, wire.key_from_json(_decode(current[9:])), parts
            current, parts = prefix, {}
        parts[int.from_bytes(raw_key[-4:], "big")] = _decode(raw)
    if parts:
        yield current, wire.key_from_json(_decode(current[9:])), parts
