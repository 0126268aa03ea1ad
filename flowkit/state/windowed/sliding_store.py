"""A sliding table's state in one worker: stage 1 (its source partitions) and stage 2
(the partitions it owns), recovered from and flushed to one changelog.

It offers the worker what a ``WindowedStore`` does (assignment, the outbox of records and
markers, the changelog, reads), so the worker runs both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...windows import SlidingSpec, Window
from . import wire
from .sliding_owner import SlidingOwners, fold, windows_of
from .sliding_source import SlidingPart, SlidingSource
from .stages import TwoStages

if TYPE_CHECKING:
    from .sliding_table import SlidingTable

__all__ = ["SlidingStore"]


class SlidingStore(TwoStages[SlidingPart], SlidingSource):
    """Stage 1 (inherited, so the per-record ``add`` reaches it in one step) and stage 2
    (``owners``) of one sliding table in one worker, with its counters."""

    # See sliding_source.py and sliding_owner.py.
    changelog_shapes: ClassVar[Mapping[str, wire.Shape]] = {
        "w": wire.Shape(1, value=wire.value_of(tuple[int, int, int, int])),
        "s": wire.Shape(2, ints=(1,), source=1, value=wire.value_of(tuple[int, int])),
        "R": wire.Shape(3, ints=(2,), key=1, value=wire.value_of(tuple[Any]), time=2),
        "e": wire.Shape(1),
    }

    def __init__(self, table: SlidingTable[Any, Any], now_ms: Callable[[], int]) -> None:
        spec = table.spec
        assert isinstance(spec, SlidingSpec)
        SlidingSource.__init__(
            self,
            spec,
            partitions=table.partitions,
            partition_of=table.partition_of,
            encode_key=table.encode_key,
            now_ms=now_ms,
            name=table.name,
        )
        self.table = table
        self.combine = table.combine
        self.owners: SlidingOwners = SlidingOwners(
            spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,
            updates=table.emit_on == "update",
        )
        self.start_counters()

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
