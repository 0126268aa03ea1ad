"""A windowed table's state in one worker: stage 1 (its source partitions) plus stage 2
(the partitions it owns), recovered from and flushed to one changelog."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...records import Message
from ...windows import Window
from . import wire
from .owner import Owners, fold_sources
from .results import Late
from .stage1 import Stage1

if TYPE_CHECKING:
    from .table import WindowedTable

__all__ = ["WindowedStore"]


class WindowedStore(Stage1):
    """Stage 1 (inherited, so the per-record ``add`` reaches it in one step) and stage 2
    (``owners``) of one windowed table in one worker, with its counters."""

    def __init__(self, table: WindowedTable[Any, Any], now_ms: Callable[[], int]) -> None:
        super().__init__(
            table.spec,
            partitions=table.partitions,
            partition_of=table.partition_of,
            encode_key=table.encode_key,
            now_ms=now_ms,
            name=table.name,
            updates=table.emit_on == "update",
        )
        self.table = table
        self.owners = Owners(
            table.spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,  # one guard on stream time for both stages
            updates=table.emit_on == "update",
        )
        self.late_records = 0
        self.callback_errors = 0
        self.late_out: list[Late] = []  # late records for a topic or async callable

    def has_outbox(self) -> bool:
        """True when partials, markers or late records wait to be sent."""
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

    def receive(self, q: int, messages: Sequence[Message]) -> list[Any]:
        """Partials and markers arriving at owner partition ``q``; the closed windows."""
        return self.owners.receive(q, messages)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain: (partition, key, value or None)."""
        records: list[tuple[int, bytes, bytes | None]] = []
        self.owners.drain_changes_into(records)
        self.drain_changes_into(records)
        return records

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from its changelog."""
        self.assign([partition])
        part = self.parts[partition]
        owner = self.owners.owners[partition]
        for m in messages:
            if m.key is None:
                continue
            parts = wire.decode(m.key)
            kind = parts[0]
            value = None if m.value is None else wire.decode(m.value)
            if kind in ("w", "p"):
                self.apply_record(part, kind, parts, value)
            else:
                self.owners.apply_record(owner, kind, parts, value)
        self.owners.recovered(owner, partition)
        self.recovered(part)

    # -- reads ----------------------------------------------------------------------------

    def windows(self, key: Any) -> dict[Window, Any]:
        """Every window this worker knows for ``key``, open and closed (until expiry)."""
        spec = self.spec
        combine = self.table.combine
        out: dict[Window, Any] = {}
        owner = self.owners.owners.get(self.table.partition_of(key))
        # The partials of the source partitions held here: a window still open on its
        # source is newest there (a running update that reached the owner may be older).
        local: dict[int, dict[int, Any]] = {}
        for p, part in self.parts.items():
            for start, window in part.partials.items():
                if key in window:
                    local.setdefault(start, {})[p] = window[key]
        if owner is not None:
            for start, finals in owner.closed.items():
                if key in finals:
                    out[spec.window(start)] = finals[key]
            for start, by_key in owner.open.items():
                if key in by_key:
                    parts = by_key[key]
                    if start in local:
                        parts = {**parts, **local.pop(start)}
                    out[spec.window(start)] = fold_sources(combine, parts)
        for start, parts in local.items():
            w = spec.window(start)
            value = fold_sources(combine, parts)
            out[w] = value if w not in out else combine(out[w], value)
        aggregation = self.table.aggregation
        if aggregation is not None and aggregation.result is not None:
            finish = aggregation.result
            return {w: finish(acc) for w, acc in sorted(out.items())}
        return dict(sorted(out.items()))

    def __iter__(self) -> Iterator[Any]:
        keys: set[Any] = set()
        for owner in self.owners.owners.values():
            for finals in owner.closed.values():
                keys.update(finals)
            for by_key in owner.open.values():
                keys.update(by_key)
        for part in self.parts.values():
            for window in part.partials.values():
                keys.update(window)
        return iter(sorted(keys, key=repr))
