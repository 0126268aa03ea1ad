"""A sliding table's state in one worker: stage 1 (its source partitions) and stage 2
(the partitions it owns), recovered from and flushed to one changelog.

It offers the worker what a ``WindowedStore`` does (assignment, the outbox of records and
markers, the changelog, reads), so the worker runs both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import DecodeError
from ...records import Message
from ...windows import SlidingSpec, Window
from . import wire
from .owner import Emission
from .results import Late
from .sliding_owner import SlidingOwners, fold, windows_of
from .sliding_source import SlidingSource

if TYPE_CHECKING:
    from .sliding_table import SlidingTable

__all__ = ["SlidingStore"]


class SlidingStore(SlidingSource):
    """Stage 1 (inherited, so the per-record ``add`` reaches it in one step) and stage 2
    (``owners``) of one sliding table in one worker, with its counters."""

    # See sliding_source.py and sliding_owner.py.
    changelog_shapes: ClassVar[Mapping[str, wire.Shape]] = {
        "w": wire.Shape(1, value=wire.value_of(tuple[int, int, int, int])),
        "s": wire.Shape(2, ints=(1,), source=1, value=wire.value_of(tuple[int, int])),
        "R": wire.Shape(3, ints=(2,), key=1, value=wire.value_of(tuple[Any])),
    }

    def __init__(self, table: SlidingTable[Any, Any], now_ms: Callable[[], int]) -> None:
        spec = table.spec
        assert isinstance(spec, SlidingSpec)
        super().__init__(
            spec,
            partitions=table.partitions,
            partition_of=table.partition_of,
            encode_key=table.encode_key,
            now_ms=now_ms,
            name=table.name,
        )
        self.table = table
        self.combine = table.combine
        self.owners = SlidingOwners(
            spec, sources=table.partitions, combine=table.combine, name=table.name, guard=self
        )
        self.late_records = 0
        self.callback_errors = 0
        self.late_out: list[Late] = []
        # Changelog records that are not this table's: the worker dead-letters them.
        self.rejected: list[tuple[Message, Exception]] = []

    def has_outbox(self) -> bool:
        """True when records, markers or late records wait to be sent."""
        return bool(self.late_out) or super().has_outbox()

    @property
    def closed_windows(self) -> int:
        """Windows this worker closed as their owner."""
        return self.owners.closed_windows

    # -- the worker's side ----------------------------------------------------------------

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

    def receive(self, q: int, messages: Sequence[Message]) -> list[Emission]:
        """Records and markers arriving at owner partition ``q``; the windows that closed."""
        return self.owners.receive(q, messages)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain: (partition, key, value or None)."""
        records: list[tuple[int, bytes, bytes | None]] = []
        for q in self.owners.owners:
            self.owners.drain_changes_into(q, records)
        self.drain_changes_into(records)
        return records

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from its changelog."""
        self.assign([partition])
        part = self.parts[partition]
        owner = self.owners.owners[partition]
        shapes, sources = self.changelog_shapes, self.partitions
        for m in messages:
            if m.key is None:
                continue
            try:
                kind, parts, value = wire.decode_change(m.key, m.value, shapes, sources)
            except DecodeError as exc:
                self.rejected.append((m, exc))
                continue
            if kind == "w":
                self.apply_record(part, value)
            else:
                self.owners.apply_record(owner, parts[0], parts, value)
        self.owners.recovered(owner, partition)
        self.recovered(part)

    def keys_held(self, partition: int) -> int:
        """Keys whose records owner partition ``partition`` holds here (for metrics)."""
        owner = self.owners.owners.get(partition)
        return 0 if owner is None else len(owner.records)

    # -- reads ----------------------------------------------------------------------------

    def records(self, key: Any) -> list[list[Any]]:
        """``key``'s records known on this worker, by time: those its owner holds (if it
        is here) and those not yet sent to it, values of one time combined."""
        owner = self.owners.owners.get(self.table.partition_of(key))
        held = list(owner.records.get(key, ())) if owner is not None else []
        unsent = [r for part in self.parts.values() for r in part.unsent_of(key)]
        if not unsent:
            return held
        merged: dict[int, Any] = {}
        for ts, v in sorted(held + unsent, key=lambda r: r[0]):
            merged[ts] = v if ts not in merged else self.combine(merged[ts], v)
        return [[ts, v] for ts, v in merged.items()]

    def windows(self, key: Any) -> dict[Window, Any]:
        """Every window ``key``'s records known here define, open and closed (until its
        records expire), by end."""
        records = self.records(key)
        return {
            Window(start, end): fold(records, start, end, self.combine)
            for start, end in windows_of(records, self.size)
        }

    def latest(self, key: Any, ts: int) -> Any:
        """The value of ``key`` over the ``size`` up to ``ts`` (both ends included), or
        None when no record is known there."""
        return fold(self.records(key), ts - self.size, ts, self.combine)

    def __iter__(self) -> Iterator[Any]:
        keys: set[Any] = set()
        for owner in self.owners.owners.values():
            keys.update(owner.records)
        for part in self.parts.values():
            keys.update(k for k, *_ in part.outbox)
        return iter(sorted(keys, key=repr))

    def __len__(self) -> int:
        return sum(1 for _ in self)
