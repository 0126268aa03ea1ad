"""A windowed table's state in one worker: stage 1 (its source partitions) plus stage 2
(the partitions it owns), recovered from and flushed to one changelog."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...windows import Window
from . import wire
from .owner import Owners, fold_sources
from .stage1 import Part, Stage1
from .stages import TwoStages

if TYPE_CHECKING:
    from .table import WindowedTable

__all__ = ["WindowedStore"]


class WindowedStore(TwoStages[Part], Stage1):
    """Stage 1 (inherited, so the per-record ``add`` reaches it in one step) and stage 2
    (``owners``) of one tumbling or hopping table in one worker, with its counters."""

    stage1_kinds = ("w", "p")
    # See wire.py.
    changelog_shapes: ClassVar[Mapping[str, wire.Shape]] = {
        "w": wire.Shape(1, value=wire.value_of(tuple[int, int, int])),
        "p": wire.Shape(3, ints=(1,), key=2, time=1),
        "o": wire.Shape(4, ints=(1, 3), key=2, source=3, time=1),
        "s": wire.Shape(2, ints=(1,), source=1, value=wire.value_of(int)),
        "c": wire.Shape(3, ints=(1,), key=2, time=1),
        "e": wire.Shape(1),
        "k": wire.Shape(1, value=wire.value_of(tuple[int, Any])),
    }

    def __init__(self, table: WindowedTable[Any, Any], now_ms: Callable[[], int]) -> None:
        Stage1.__init__(
            self,
            table.spec,
            partitions=table.partitions,
            partition_of=table.partition_of,
            encode_key=table.encode_key,
            now_ms=now_ms,
            name=table.name,
            updates=table.emit_on == "update",
        )
        self.table = table
        self.owners: Owners = Owners(
            table.spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,  # one guard on stream time for both stages
            updates=table.emit_on == "update",
        )
        self.start_counters()

    # -- reads ----------------------------------------------------------------------------

    def keys_held(self, partition: int) -> int:
        """Partials of the windows open on source partition ``partition`` (a key in each
        window it is in), for metrics."""
        part = self.parts.get(partition)
        return 0 if part is None else sum(map(len, part.partials.values()))

    def windows(self, key: Any) -> dict[Window, Any]:
        """Every window this worker knows for ``key``, open and closed (until expiry)."""
        spec = self.spec
        combine = self.table.combine
        # The partials of the source partitions held here: a window still open on its
        # source is newest there (a running update that reached the owner may be older).
        local = self.local(key)
        out = self._owned(key, local)  # takes from ``local`` what it folds in
        for start, parts in local.items():
            w = spec.window(start)
            value = fold_sources(combine, parts)
            out[w] = value if w not in out else combine(out[w], value)
        aggregation = self.table.aggregation
        if aggregation is not None and aggregation.result is not None:
            finish = aggregation.result
            return {w: finish(acc) for w, acc in sorted(out.items())}
        return dict(sorted(out.items()))

    def _owned(self, key: Any, local: dict[int, dict[int, Any]]) -> dict[Window, Any]:
        """``key``'s windows in the partition this worker owns, if it does: closed ones'
        final values, open ones' partials folded with those of ``local`` (popped)."""
        spec, combine = self.spec, self.table.combine
        out: dict[Window, Any] = {}
        owner = self.owners.owners.get(self.table.partition_of(key))
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
        return out

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
