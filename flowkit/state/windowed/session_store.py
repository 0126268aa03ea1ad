"""A session table's state in one worker: stage 1 (its source partitions) and stage 2
(the partitions it owns), recovered from and flushed to one changelog.

It offers the worker what a ``WindowedStore`` does (assignment, the outbox of closed
sessions and markers, the changelog, reads), so the worker runs both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...records import Message
from ...windows import SessionSpec, Window
from . import wire
from .owner import Emission
from .results import Late
from .session_owner import SessionOwners, value_of
from .session_source import SessionSource

if TYPE_CHECKING:
    from .session_table import SessionTable

__all__ = ["SessionStore"]


class SessionStore(SessionSource):
    """Stage 1 (inherited, so the per-record ``add`` reaches it in one step) and stage 2
    (``owners``) of one session table in one worker, with its counters."""

    def __init__(self, table: SessionTable[Any, Any], now_ms: Callable[[], int]) -> None:
        spec = table.spec
        assert isinstance(spec, SessionSpec)
        super().__init__(
            spec,
            table.combine,
            partitions=table.partitions,
            partition_of=table.partition_of,
            encode_key=table.encode_key,
            now_ms=now_ms,
            name=table.name,
        )
        self.table = table
        self.owners = SessionOwners(
            spec, sources=table.partitions, combine=table.combine, name=table.name, guard=self
        )
        self.late_records = 0
        self.callback_errors = 0
        self.late_out: list[Late] = []

    def has_outbox(self) -> bool:
        """True when closed sessions, markers or late records wait to be sent."""
        return bool(self.late_out) or super().has_outbox()

    @property
    def closed_windows(self) -> int:
        """Sessions this worker closed as their owner."""
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
        """Closed sessions and markers arriving at owner partition ``q``; the sessions
        that closed there."""
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
        for m in messages:
            if m.key is None:
                continue
            parts = wire.decode(m.key)
            kind = parts[0]
            value = None if m.value is None else wire.decode(m.value)
            if kind in ("w", "S"):
                self.apply_record(part, kind, parts, value)
            else:
                self.owners.apply_record(owner, kind, parts, value)
        self.owners.recovered(owner, partition)
        self.recovered(part)

    # -- reads ----------------------------------------------------------------------------

    def windows(self, key: Any) -> dict[Window, Any]:
        """The sessions this worker knows for ``key``: closed (until they expire) and open,
        those of several partitions within ``gap`` of each other shown merged."""
        combine = self.combine
        out: dict[Window, Any] = {}
        opened: list[list[Any]] = []
        owner = self.owners.owners.get(self.table.partition_of(key))
        if owner is not None:
            for start, end, value in owner.closed.get(key, ()):
                out[Window(start, end)] = value
            for session in owner.open.get(key, ()):
                opened.append([session[0], session[1], value_of(session, combine)])
        for part in self.parts.values():
            opened.extend(list(s) for s in part.partials.get(key, ()))
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
            keys.update(owner.closed)
        for part in self.parts.values():
            keys.update(part.partials)
        return iter(sorted(keys, key=repr))

    def __len__(self) -> int:
        return sum(1 for _ in self)
