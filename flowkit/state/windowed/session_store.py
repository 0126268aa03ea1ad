"""A session table's state in one worker: stage 1 (its source partitions) and stage 2
(the partitions it owns), recovered from and flushed to one changelog.

It offers the worker what a ``WindowedStore`` does (assignment, the outbox of closed
sessions and markers, the changelog, reads), so the worker runs both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...windows import SessionSpec, Window
from . import wire
from .session_owner import SessionOwners
from .session_source import SessionPart, SessionSource
from .stages import NONE, TwoStages

if TYPE_CHECKING:
    from .session_table import SessionTable

__all__ = ["SessionStore"]

# Sessions in a changelog value: [start, end, value] each (an owner's: [start, end, pieces]).
_SESSIONS = wire.value_of(list[tuple[int, int, Any]])


def _latest(sessions: list[tuple[int, int, Any]]) -> int:
    # The latest time of sessions [start, end, ...]: one beyond max_future is refused.
    return max((max(start, end) for start, end, _ in sessions), default=NONE)


class SessionStore(TwoStages[SessionPart], SessionSource):
    """Stage 1 (inherited, so the per-record ``add`` reaches it in one step) and stage 2
    (``owners``) of one session table in one worker, with its counters."""

    stage1_kinds = ("w", "S")
    # See session_source.py and session_owner.py.
    changelog_shapes: ClassVar[Mapping[str, wire.Shape]] = {
        "w": wire.Shape(1, value=wire.value_of(tuple[int, int, int])),
        "S": wire.Shape(2, key=1, value=_SESSIONS, latest=_latest),
        "O": wire.Shape(
            2,
            key=1,
            # pieces: [source, start, end, value], and 1 after for a running copy
            value=wire.value_of(list[tuple[int, int, list[list[Any]]]]),
            latest=_latest,
        ),
        "C": wire.Shape(2, key=1, value=_SESSIONS, latest=_latest),
        "s": wire.Shape(2, ints=(1,), source=1, value=wire.value_of(int)),
        "e": wire.Shape(1),
    }

    def __init__(self, table: SessionTable[Any, Any], now_ms: Callable[[], int]) -> None:
        spec = table.spec
        assert isinstance(spec, SessionSpec)
        SessionSource.__init__(
            self,
            spec,
            table.combine,
            partitions=table.partitions,
            partition_of=table.partition_of,
            encode_key=table.encode_key,
            now_ms=now_ms,
            name=table.name,
            updates=table.emit_on == "update",
        )
        self.table = table
        self.owners: SessionOwners = SessionOwners(
            spec,
            sources=table.partitions,
            combine=table.combine,
            name=table.name,
            guard=self,
            updates=table.emit_on == "update",
        )
        self.start_counters()

    # -- reads ----------------------------------------------------------------------------

    def keys_held(self, partition: int) -> int:
        """Sessions open on source partition ``partition`` (a key in each session it is
        in), for metrics: in memory on either store."""
        part = self.parts.get(partition)
        return 0 if part is None else sum(map(len, part.partials.values()))

    def windows(self, key: Any) -> dict[Window, Any]:
        """The sessions this worker knows for ``key``: closed (until they expire) and open,
        those of several partitions within ``gap`` of each other shown merged."""
        combine = self.combine
        out: dict[Window, Any] = {}
        opened: list[list[Any]] = []
        local = {p: part.partials.get(key, ()) for p, part in self.parts.items()}
        owner = self.owners.owners.get(self.table.partition_of(key))
        if owner is not None:
            for start, end, value in self.owners.closed_of(owner, key):
                out[Window(start, end)] = value
            for session in owner.open.get(key, ()):
                for (src, ps), (pe, value, _) in session[2].items():
                    # A session still open on a source held here is newest there (a
                    # running update that reached the owner may be older).
                    if not any(s[0] <= pe and ps <= s[1] for s in local.get(src, ())):
                        opened.append([ps, pe, value])
        for sessions in local.values():
            opened.extend(list(s) for s in sessions)
        opened.sort(key=lambda s: s[0])
        merged: list[list[Any]] = []
        for s in opened:
            if merged and s[0] - self.gap <= merged[-1][1]:
                last = merged[-1]
                last[1] = max(last[1], s[1])
                last[2] = combine(last[2], s[2])
            else:
                merged.append(s)
        for start, end, value in merged:
            out[Window(start, end)] = value
        aggregation = self.table.aggregation
        if aggregation is not None and aggregation.result is not None:
            finish = aggregation.result
            return {w: finish(acc) for w, acc in sorted(out.items())}
        return dict(sorted(out.items()))

    def latest(self, key: Any, ts: int) -> Any:
        """The value of ``key``'s latest session that starts at or before ``ts``, or None."""
        found = None
        for window, value in self.windows(key).items():
            if window.start <= ts:
                found = value
        return found

    def __iter__(self) -> Iterator[Any]:
        keys: set[Any] = set()
        for owner in self.owners.owners.values():
            keys.update(owner.open)
            keys.update(self.owners.closed_keys(owner))
        for part in self.parts.values():
            keys.update(part.partials)
        return iter(sorted(keys, key=repr))

    def __len__(self) -> int:
        return sum(1 for _ in self)
