"""What the two stages of every windowed table kind share, whatever their windows.

Each kind keeps its own per-partition state (a part class for stage 1, an owner class for
stage 2) and its own rules for adding, closing and merging; the rules on holding
partitions, announcing watermarks, rejected records and replayed results are written once
here, for tumbling, hopping and session tables alike:

* ``Sources``: stage 1, the source partitions a worker holds, and their watermarks;
* ``OwnersBase``: stage 2, the partitions a worker owns;
* ``TwoStages``: one table's store in one worker, both stages and their counters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ...errors import DecodeError, NotRunningError
from ...records import Message
from ...streamtime import FutureGuard
from ...windows import Window, WindowSpec
from ..refusals import keyless
from . import wire

if TYPE_CHECKING:
    from .results import Late
    from .table import WindowedTable

__all__ = ["INF", "NONE", "Emission", "OwnersBase", "SourcePart", "Sources", "TwoStages"]

NONE = -(2**62)  # "no watermark yet": below every real event time
INF = 2**62

Emission = tuple[Any, Window, Any]
"""(key, window, value) of a closed window, or of a running update."""

Change = tuple[int, bytes, bytes | None]
"""A changelog record: (partition, key, value or None)."""


class SourcePart(Protocol):
    """What ``Sources`` reads of a source partition's state."""

    number: int
    wm: int  # the watermark: stream time minus grace
    max_ts: int  # stream time: the largest event time seen
    sent_wm: int  # the watermark last announced to the owners
    active: float  # when the partition was first seen caught up and quiet (-1.0: not)
    logged: tuple[int, ...] | None  # (wm, max_ts, sent_wm, ...) as the changelog has them
    # With running updates, what changed since the last flush (None: no updates).
    changed: set[Any] | None


P = TypeVar("P", bound=SourcePart)


class Sources(FutureGuard, Generic[P]):
    """One worker's stage-1 state of one windowed table: its source partitions, each a
    part made by ``new_part(number, updates)``. The guard on stream time (``max_future``)
    is inherited, so the per-record ``add`` reads its limit in one step."""

    def __init__(
        self,
        spec: WindowSpec,
        new_part: Callable[[int, bool], P],
        *,
        partitions: int,
        partition_of: Callable[[Any], int],
        encode_key: Callable[[Any], bytes] = wire.encode,
        now_ms: Callable[[], int] = lambda: 0,
        name: str = "table",
        updates: bool = False,
    ) -> None:
        super().__init__(spec.max_future_ms, now_ms=now_ms, owner=f"table {name!r}")
        self.spec = spec
        self.updates = updates  # ship open windows' changes at every flush
        self.partitions = partitions
        self.name = name
        self._new_part = new_part
        self._partition_of = partition_of
        self._encode_key = encode_key
        self.parts: dict[int, P] = {}
        self._outbox: list[tuple[int, bytes | None, bytes]] = []

    # -- adds -----------------------------------------------------------------------------

    def part_of_batch(self, batch: Any) -> P:
        """The state of ``batch``'s partition."""
        part = self.parts.get(batch.tp.partition)
        if part is None:
            raise NotRunningError(f"table {self.name!r}: that partition is not held here")
        part.active = -1.0  # a batch with adds: the partition is not quiet
        return part

    def part_of_key(self, key: Any) -> P:
        """The state of the partition that owns ``key`` (adds outside an agent)."""
        part = self.parts.get(self._partition_of(key))
        if part is None:
            raise NotRunningError(f"table {self.name!r}: that partition is not held here")
        part.active = -1.0
        return part

    def advance(self, part: P, ts: int) -> None:
        """Event time ``ts`` (newer than any seen) moves ``part``'s stream time."""
        if ts > self.future_limit:
            self.check_future(ts)
        part.max_ts = ts
        self.set_wm(part, ts - self.spec.grace_ms)

    def set_wm(self, part: P, wm: int) -> None:
        """Move ``part``'s watermark to ``wm`` (if later) and close what it passes."""
        raise NotImplementedError

    # -- the worker's side ----------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these source partitions."""
        for p in partitions:
            if p not in self.parts:
                self.parts[p] = self._new_part(p, self.updates)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        for p in partitions:
            self.parts.pop(p, None)

    def tick(self, now: float, caught_up: set[int], idle_timeout: float | None) -> None:
        """A caught-up partition with no records for ``idle_timeout`` seconds moves its
        watermark to the wall clock minus grace (never, when ``idle_timeout`` is None)."""
        if idle_timeout is None:
            return
        for part in idle_parts(self.parts, now, caught_up, idle_timeout):
            self.set_wm(part, self.now_ms() - self.spec.grace_ms)

    def ship_updates(self) -> None:
        """Put the running updates since the last flush into the outbox (``updates``)."""

    def drain_outbox(self) -> list[tuple[int, bytes | None, bytes]]:
        """What to send, (partition, key, value): what closed, the running updates, then
        a watermark marker to every owner from each partition whose watermark moved on."""
        if self.updates:
            self.ship_updates()
        for p, part in self.parts.items():
            if self.announce(part):
                self.mark(p, part)
        out, self._outbox = self._outbox, []
        return out

    def mark(self, p: int, part: P) -> None:
        """Put a marker of ``part``'s watermark to every owner into the outbox."""
        part.sent_wm = part.wm
        marker = wire.marker(part.wm, p)
        self._outbox.extend((q, None, marker) for q in range(self.partitions))

    def requeue_outbox(self, items: list[tuple[int, bytes | None, bytes]]) -> None:
        """Put back, in front, what ``drain_outbox`` gave and was not sent."""
        self._outbox[:0] = items

    def has_outbox(self) -> bool:
        """True when records, running updates or markers wait to be sent."""
        if self._outbox:
            return True
        if self.updates and any(part.changed for part in self.parts.values()):
            return True
        return any(self.announce(part) for part in self.parts.values())

    def announce(self, part: P) -> bool:
        """True when ``part``'s watermark is to be announced: it moved into a new step of
        the kind's (a window step, a session gap) since it last was."""
        if part.wm == NONE:
            return False
        step = self.marker_step
        return part.sent_wm == NONE or part.wm // step > part.sent_wm // step

    @property
    def marker_step(self) -> int:
        """Owners can close nothing new while the watermark stays within one step."""
        return self.spec.step_ms

    # -- the changelog --------------------------------------------------------------------

    def drain_changes_into(self, out: list[Change]) -> None:
        """Append stage 1's changelog records since the last drain to ``out``."""
        raise NotImplementedError

    def apply_record(self, part: P, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1."""
        raise NotImplementedError

    def recovered(self, part: P) -> None:
        """Tidy ``part`` after its changelog was applied."""
        raise NotImplementedError

    def log_watermark(self, part: P, out: list[Change]) -> None:
        """Append ``part``'s stream time to ``out`` if it changed since the last time."""
        state = (part.wm, part.max_ts, part.sent_wm)
        if part.wm != NONE and part.logged != state:
            part.logged = state
            out.append((part.number, wire.WATERMARK_KEY, wire.encode(state)))

    def apply_watermark(self, part: P, value: Any) -> None:
        """Apply a changelog record of ``part``'s stream time (kind "w")."""
        if value is not None:
            part.wm, part.max_ts, part.sent_wm = value
            part.logged = tuple(value)

    def trust_watermark(self, part: P) -> None:
        """A stream time recovered beyond ``max_future`` (an older version's, or a wrong
        clock's) starts again: what it closed is shipped, and it must not make every
        record late."""
        if part.max_ts != NONE and not self.trusts(part.max_ts, part.number):
            part.wm = part.max_ts = part.sent_wm = NONE
            part.logged = None


class _Idles(Protocol):
    active: float  # when the partition was first seen caught up and quiet (-1.0: not)


Q = TypeVar("Q", bound=_Idles)


def idle_parts(
    parts: dict[int, Q], now: float, caught_up: set[int], idle_timeout: float
) -> list[Q]:
    """The parts of ``parts`` whose partitions have been caught up with no records for
    ``idle_timeout`` seconds at ``now`` (the idle close of every windowed table kind);
    each part's ``active`` keeps when its quiet began."""
    idle: list[Q] = []
    for p, part in parts.items():
        if p not in caught_up:
            part.active = -1.0
        elif part.active < 0:
            part.active = now
        elif now - part.active >= idle_timeout:
            idle.append(part)
    return idle


class OwnerPart(Protocol):
    """What ``OwnersBase`` reads of an owning partition's state."""

    source_wm: list[int]
    # From the changelog: the last repartition offset whose records closed windows in an
    # earlier run (-1: none).
    emitted_through: int


OP = TypeVar("OP", bound=OwnerPart)


class OwnersBase(Generic[OP]):
    """One worker's stage-2 state of one windowed table: the partitions it owns, each an
    owner made by ``new_owner(sources)``."""

    marks_replays = True
    stepwise = False
    """True for owners that close windows in steps (``closing``, ``step``, ``stepped``:
    see ``disk_owner.py``), one per checkpoint; False: ``receive`` closes them at once."""

    def __init__(
        self,
        new_owner: Callable[[int], OP],
        *,
        sources: int,
        name: str = "table",
        guard: FutureGuard | None = None,
        updates: bool = False,
    ) -> None:
        self._new_owner = new_owner
        self.sources = sources
        self.name = name
        # The table's guard on stream time: a marker beyond it is not trusted (a source's
        # watermark comes from the internal topic, which anyone with produce rights can
        # write). None: markers are taken as they come.
        self.guard = guard
        # Running updates (emit_on="update"): each change of a key's value in an open
        # window, collected by receive() for the worker (take_updates).
        self.updates = updates
        self._updates: list[Emission] = []
        self.owners: dict[int, OP] = {}
        self.closed_windows = 0
        self.replays_ignored = 0
        # Records of the repartition topic that flowkit did not write, with why: the
        # worker dead-letters them (``take_rejected``), and nothing else sees them.
        self.rejected: list[tuple[Message, Exception]] = []

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Apply what arrived on repartition partition ``q``; the windows that closed."""
        raise NotImplementedError

    def drain_changes_into(self, out: list[Change]) -> None:
        """Append stage 2's changelog records since the last drain to ``out``."""
        raise NotImplementedError

    def apply_record(self, owner: OP, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 2."""
        raise NotImplementedError

    def recovered(self, owner: OP, partition: int) -> None:
        """Tidy ``owner`` after its changelog was applied."""
        raise NotImplementedError

    def closing(self) -> bool:
        """True while an owned partition has a window to close in steps (``stepwise``)."""
        return False

    def holding(self) -> bool:
        """True when changes held for the next checkpoint call for it at once
        (``stepwise``)."""
        return False

    def owner_of(self, q: int) -> OP:
        """The state of owner partition ``q``."""
        owner = self.owners.get(q)
        if owner is None:
            raise NotRunningError(f"table {self.name!r}: partition {q} is not held here")
        return owner

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
                self.owners[p] = self._new_owner(self.sources)

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

    def apply_emitted(self, owner: OP, value: Any) -> None:
        """Apply a changelog record of ``emitting`` (kind "e")."""
        owner.emitted_through = value if type(value) is int else -1  # not a bool either

    def trust_watermarks(self, owner: OP, partition: int) -> None:
        """A source's watermark recovered beyond ``max_future`` is not trusted: the
        owner waits for that source's next marker instead."""
        if self.guard is not None:
            for src, wm in enumerate(owner.source_wm):
                if wm != NONE and not self.guard.trusts(wm, partition):
                    owner.source_wm[src] = NONE


class TwoStages(Sources[P]):
    """One table's state in one worker: stage 1 (inherited, so the per-record ``add``
    reaches it in one step) and stage 2 (``owners``), recovered from and flushed to one
    changelog, with the worker's counters. ``stage1_kinds``: the changelog kinds of
    stage 1's records; the others are stage 2's."""

    stage1_kinds: tuple[str, ...] = ("w",)
    changelog_shapes: ClassVar[Mapping[str, wire.Shape]]  # each kind of changelog record
    table: WindowedTable[Any, Any]
    owners: OwnersBase[Any]

    def start_counters(self) -> None:
        """The worker's counters of this table, at zero."""
        self.late_records = 0
        self.callback_errors = 0
        self.late_out: list[Late] = []  # late records for a topic or async callable
        # Changelog records that are not this table's: the worker dead-letters them.
        self.rejected: list[tuple[Message, Exception]] = []

    def has_outbox(self) -> bool:
        """True when records, markers or late records wait to be sent."""
        return bool(self.late_out) or super().has_outbox()

    @property
    def closed_windows(self) -> int:
        """Windows this worker closed as their owner."""
        return self.owners.closed_windows

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these partitions, as source and as owner."""
        ps = list(partitions)
        super().assign(ps)
        self.owners.assign(ps)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        ps = list(partitions)
        super().revoke(ps)
        self.owners.revoke(ps)

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self.parts)

    def hand_over(self, partition: int, to: TwoStages[P]) -> None:
        """Move ``partition``'s state, both stages, to ``to``, a store of the same table:
        a standby copy becomes the owner's state (the objects, not a copy of them)."""
        to.parts[partition] = self.parts.pop(partition)
        to.owners.owners[partition] = self.owners.owners.pop(partition)
        # Heaps order entries of one time by a counter: the taker's goes on after the
        # giver's, so what it adds sorts after what came, as in one store's replay.
        for giver, taker in ((self, to), (self.owners, to.owners)):
            mine, theirs = getattr(giver, "_n", None), getattr(taker, "_n", None)
            if mine is not None and theirs is not None:
                setattr(taker, "_n", itertools.count(max(next(mine), next(theirs))))  # noqa: B010

    def reset(self, partition: int) -> None:
        """Forget ``partition``'s state, both stages (it is rebuilt from the changelog)."""
        self.revoke([partition])
        self.assign([partition])

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """What arrived at owner partition ``q``; the windows that closed there."""
        return self.owners.receive(q, messages)

    def drain_changes(self) -> list[Change]:
        """Changelog records since the last drain: (partition, key, value or None)."""
        records: list[Change] = []
        self.owners.drain_changes_into(records)
        self.drain_changes_into(records)
        return records

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from its changelog."""
        self.assign([partition])
        part = self.parts[partition]
        owners = self.owners
        owner = owners.owners[partition]
        stage1, shapes, sources = self.stage1_kinds, self.changelog_shapes, self.partitions
        for m in messages:
            if m.key is None:
                self.rejected.append((m, keyless()))
                continue
            try:
                kind, parts, value = wire.decode_change(m.key, m.value, shapes, sources, self)
                if kind in stage1:
                    self.apply_record(part, kind, parts, value)
                else:
                    owners.apply_record(owner, kind, parts, value)
            except DecodeError as exc:  # (on disk: a window start beyond 64 bits too)
                self.rejected.append((m, exc))
        owners.recovered(owner, partition)
        self.recovered(part)
