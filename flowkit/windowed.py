"""Windowed tables: aggregates per key per event-time window, in two phases.

Counting by another key than the stream's (YSB: events partitioned by user, counted by
campaign) needs the count on the partition that owns the campaign. A repartition hop per
record is slow, so a windowed table aggregates in two phases, as Flink and Spark do:

1. **Per source partition.** ``counts.add(key, n)`` (or ``counts[key] += n``) in an agent
   updates this partition's *partial* value for the record's window, with the table's
   associative ``combine`` (``+`` by default). No hop.
2. **On the owning partition.** When a source partition's watermark passes a window's end,
   the window's partials go through the repartition topic ``<app>-<table>-repartition``
   to the partitions that own their keys, followed by a watermark marker to every
   partition. The owner combines the partials of all sources and closes the window once
   every source partition's watermark has passed its end: the final value of each key goes
   once to ``on_close`` and/or the ``to`` topic; it stays readable until ``expires``.

One hop per window, key and source partition instead of one per record, with the same
result. Partials are stored per source, so a replayed partial replaces rather than adds.

Watermark: per source partition, the largest event time seen minus ``grace``. A record
whose window has already closed on its partition is late: it is counted, logged, and
raised as ``LateRecord`` (so it goes to the dead-letter topic) unless ``late="drop"`` or
a callable. A partition that has caught up and sees no records for ``idle_timeout``
seconds moves its watermark to the wall clock minus grace, so quiet partitions do not
hold windows open for ever.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import structlog

from .errors import DefinitionError, NotRunningError, ProcessingError
from .records import Message
from .streams import active_source
from .tables import TableBase
from .windows import Window, WindowResult, WindowSpec

if TYPE_CHECKING:
    from .topics import Topic

__all__ = ["Emission", "LateRecord", "WindowedTable"]

K = TypeVar("K")
V = TypeVar("V")

log = structlog.get_logger(__name__)

_NONE = -(2**62)  # "no watermark yet": below every real event time


class LateRecord(ProcessingError):
    """A record arrived for a window that has already closed on its partition."""

    stage = "window"


class FutureRecord(ProcessingError):
    """A record's event time is further ahead of the wall clock than ``max_future``."""

    stage = "window"


Emission = tuple[Any, Window, Any]
"""(key, window, final value) of a closed window."""

_encoder = msgspec.json.Encoder()
_decode_any = msgspec.json.Decoder().decode


class _Owner:
    """Stage-2 state of one owning partition."""

    __slots__ = ("closed", "open", "source_wm")

    def __init__(self, sources: int) -> None:
        self.open: dict[int, dict[Any, dict[int, Any]]] = {}  # start -> key -> source -> v
        self.closed: dict[int, dict[Any, Any]] = {}  # start -> key -> final value
        self.source_wm: list[int] = [_NONE] * sources


class WindowedTable(TableBase[K, V]):
    """A table of per-key aggregates over event-time windows. Declare it with
    ``app.table(...).tumbling(...)`` or ``.hopping(...)``.

    >>> import flowkit
    >>> app = flowkit.App("ads", partitions=4)
    >>> counts = app.table("counts", default=int).tumbling(10.0)
    >>> counts.spec.size_ms, counts.spec.grace_ms
    (10000, 10000)
    """

    kind = "windowed_table"

    def __init__(
        self,
        name: str,
        *,
        spec: WindowSpec,
        combine: Callable[[V, V], V] = operator.add,
        on_close: Callable[[K, Window, V], Any] | None = None,
        to: Topic[Any] | None = None,
        time: Callable[[Any], int] | None = None,
        late: str | Callable[[K, Window, Any], Any] = "dlq",
        idle_timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        if late not in ("dlq", "drop") and not callable(late):
            raise DefinitionError(f"table {name!r}: late must be 'dlq', 'drop' or a callable")
        self.spec = spec
        self.combine = combine
        self.on_close = on_close
        self.to = to
        self.time = time
        self.late = late
        self.idle_timeout = idle_timeout
        self.late_records = 0
        self.closed_windows = 0
        self.now_ms: Callable[[], int] = _unset_clock
        # stage 1, per source partition
        self._partials: dict[int, dict[int, dict[Any, Any]]] = {}
        self._wm: dict[int, int] = {}
        self._max_ts: dict[int, int] = {}
        self._next_end: dict[int, int] = {}
        self._sent_wm: dict[int, int] = {}
        self._active: dict[int, float] = {}
        self._dirty_windows: dict[int, set[int]] = {}
        self._shipped: list[tuple[int, int, list[Any]]] = []  # (partition, start, keys)
        self._outbox: list[tuple[int, bytes | None, bytes]] = []
        # stage 2, per owning partition
        self._owners: dict[int, _Owner] = {}
        self._changes2: list[tuple[int, bytes, bytes | None]] = []
        self._logged_wm: dict[int, tuple[int, int, int]] = {}

    @property
    def repartition_topic(self) -> str:
        """The internal topic that carries partials to their owners."""
        return f"{self.app_name}-{self.name}-repartition"

    def describe(self) -> dict[str, object]:
        return {**super().describe(), **self.spec.describe(), "repartition": self.repartition_topic}

    # -- stage 1: adds in agents ----------------------------------------------------------

    def add(self, key: K, amount: V, *, ts: int | None = None) -> None:
        """Combine ``amount`` into ``key``'s value in the window(s) containing ``ts``.

        ``ts`` is event time in milliseconds; without it the time comes from the record the
        agent is processing (the table's ``time`` function, else the record timestamp).
        """
        source = active_source()
        if source is not None and source.batch is not None:
            p = source.batch.tp.partition
            if ts is None:
                ts = self._time_of(source)
        else:
            if ts is None:
                raise NotRunningError(
                    f"table {self.name!r}: outside an agent, add() needs ts= (event time, ms)"
                )
            p = self.partition_of(key)
        partials = self._partials.get(p)
        if partials is None:
            raise NotRunningError(
                f"table {self.name!r}: partition {p} is not assigned to this worker"
            )
        spec = self.spec
        if ts > self._max_ts[p]:
            self._advance(p, ts)
        wm = self._wm[p]
        self._active[p] = -1.0  # seen data: not idle
        dirty = self._dirty_windows[p]
        size = spec.size_ms
        if spec.step_ms == size:
            starts: Iterable[int] = (ts - ts % size,)
        else:
            starts = spec.starts(ts)
        for start in starts:
            if start + size <= wm:
                self._late(key, spec.window(start), amount)
                continue
            window = partials.get(start)
            if window is None:
                window = partials[start] = {}
                end = start + size
                if end < self._next_end[p]:
                    self._next_end[p] = end
            old = window.get(key, _MISSING)
            window[key] = amount if old is _MISSING else self.combine(old, amount)
            dirty.add(start)

    def __getitem__(self, key: K) -> V:
        """Inside an agent: this partition's running part of ``key`` in the current
        window (so ``counts[key] += 1`` adds 1). Use ``value()`` for the combined value."""
        source = active_source()
        if source is None or source.batch is None:
            raise NotRunningError(
                f"windowed table {self.name!r}: table[key] works inside an agent only; "
                "use value(key, ts=...) elsewhere"
            )
        p = source.batch.tp.partition
        start = self._current_start(source)
        window = self._partials.get(p, {}).get(start, {})
        if key in window:
            return window[key]  # type: ignore[no-any-return]
        if self.default is None:
            raise KeyError(key)
        return self.default()

    def __setitem__(self, key: K, value: V) -> None:
        source = active_source()
        if source is None or source.batch is None:
            raise NotRunningError(
                f"windowed table {self.name!r}: table[key] = v works inside an agent only"
            )
        p = source.batch.tp.partition
        ts = self._time_of(source)
        if ts > self._max_ts[p]:
            self._advance(p, ts)
        start = ts - ts % self.spec.step_ms
        if start + self.spec.size_ms <= self._wm[p]:
            self._late(key, self.spec.window(start), value)
            return
        window = self._partials[p].setdefault(start, {})
        end = start + self.spec.size_ms
        if end < self._next_end[p]:
            self._next_end[p] = end
        window[key] = value
        self._dirty_windows[p].add(start)

    def _current_start(self, source: Any) -> int:
        ts = self._time_of(source)
        return ts - ts % self.spec.step_ms

    def _time_of(self, source: Any) -> int:
        batch = source.batch
        if self.time is not None:
            return int(self.time(batch.values[source.pos]))
        return int(batch.messages[source.pos].timestamp)

    def _advance(self, p: int, ts: int) -> None:
        if ts > self.now_ms() + self.spec.max_future_ms:
            raise FutureRecord(
                f"event time {ts} is more than {self.spec.max_future_ms} ms ahead of the "
                f"wall clock; table {self.name!r} does not let it move the watermark"
            )
        self._max_ts[p] = ts
        wm = ts - self.spec.grace_ms
        if wm > self._wm[p]:
            self._wm[p] = wm
            if wm >= self._next_end[p]:
                self._close_partials(p)

    def _late(self, key: K, window: Window, amount: Any) -> None:
        self.late_records += 1
        log.debug("late record", table=self.name, key=key, window_start=window.start)
        if self.late == "drop":
            return
        if callable(self.late):
            self.late(key, window, amount)
            return
        raise LateRecord(
            f"record for window [{window.start}, {window.end}) of table {self.name!r} "
            "arrived after the window closed on its partition"
        )

    def _close_partials(self, p: int) -> None:
        """Ship every window that ended at or before the watermark to its owners."""
        wm = self._wm[p]
        partials = self._partials[p]
        size = self.spec.size_ms
        next_end = _INF
        for start in sorted(partials):
            if start + size > wm:
                next_end = min(next_end, start + size)
                continue
            window = partials.pop(start)
            for key, value in window.items():
                raw_key = self.encode_key(key)
                self._outbox.append(
                    (self.partition_of(key), raw_key, _encoder.encode(("p", start, p, key, value)))
                )
            self._shipped.append((p, start, list(window)))
            self._dirty_windows[p].discard(start)
        self._next_end[p] = next_end

    # -- the worker's side: stage 1 --------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these partitions (as source and as owner)."""
        for p in partitions:
            if p in self._partials:
                continue
            self._partials[p] = {}
            self._wm[p] = _NONE
            self._max_ts[p] = _NONE
            self._next_end[p] = _INF
            self._sent_wm[p] = _NONE
            self._active[p] = -1.0
            self._dirty_windows[p] = set()
            self._owners[p] = _Owner(self.partitions)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        for p in partitions:
            for d in (
                self._partials,
                self._wm,
                self._max_ts,
                self._next_end,
                self._sent_wm,
                self._active,
                self._dirty_windows,
                self._owners,
            ):
                d.pop(p, None)

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self._partials)

    def tick(self, now: float, caught_up: set[int]) -> None:
        """Idle handling: a caught-up partition with no adds for ``idle_timeout`` seconds
        moves its watermark to the wall clock minus grace."""
        for p in list(self._partials):
            since = self._active.get(p, -1.0)
            if p not in caught_up:
                self._active[p] = -1.0
                continue
            if since < 0:
                self._active[p] = now
                continue
            if now - since >= self.idle_timeout:
                wm = self.now_ms() - self.spec.grace_ms
                if wm > self._wm[p]:
                    self._wm[p] = wm
                    if wm >= self._next_end[p]:
                        self._close_partials(p)

    def drain_outbox(self) -> list[tuple[int, bytes | None, bytes]]:
        """Partials and watermark markers to send: (partition, key, value)."""
        for p, wm in self._wm.items():
            if self._announce(p, wm):
                self._sent_wm[p] = wm
                marker = _encoder.encode(("w", wm, p, None, None))
                self._outbox.extend((q, None, marker) for q in range(self.partitions))
        out, self._outbox = self._outbox, []
        return out

    def has_outbox(self) -> bool:
        """True when partials or markers wait to be sent."""
        if self._outbox:
            return True
        return any(self._announce(p, wm) for p, wm in self._wm.items())

    def _announce(self, p: int, wm: int) -> bool:
        # A marker only when the watermark crosses a window boundary: owners can close
        # nothing new in between, so one marker per window per partition is enough.
        if wm == _NONE:
            return False
        sent = self._sent_wm[p]
        step = self.spec.step_ms
        return sent == _NONE or wm // step > sent // step

    # -- stage 2: partials arriving at their owner -----------------------------------------

    def receive(self, q: int, messages: list[Message]) -> list[Emission]:
        """Apply partials and markers that arrived on repartition partition ``q``; return
        the windows that closed, oldest first."""
        owner = self._owners.get(q)
        if owner is None:
            raise NotRunningError(f"table {self.name!r}: partition {q} is not held here")
        size = self.spec.size_ms
        changed_wm = False
        for m in messages:
            if m.value is None:
                continue
            kind, a, src, key, value = _decode_any(m.value)
            if kind == "p":
                start = a
                horizon = min(owner.source_wm)
                if start + size <= horizon or start in owner.closed:
                    log.info(
                        "partial for a closed window ignored (a replay)",
                        table=self.name,
                        window_start=start,
                        source=src,
                    )
                    continue
                key = self._key_from_json(key)
                owner.open.setdefault(start, {}).setdefault(key, {})[src] = value
                self._changes2.append(
                    (q, _encoder.encode(("o", start, key, src)), _encoder.encode(value))
                )
            elif kind == "w" and a > owner.source_wm[src]:
                owner.source_wm[src] = a
                changed_wm = True
                self._changes2.append((q, _encoder.encode(("s", src)), _encoder.encode(a)))
        if not changed_wm:
            return []
        return self._close_owner(q, owner)

    def _close_owner(self, q: int, owner: _Owner) -> list[Emission]:
        horizon = min(owner.source_wm)
        size = self.spec.size_ms
        out: list[Emission] = []
        for start in sorted(owner.open):
            if start + size > horizon:
                break
            by_key = owner.open.pop(start)
            finals: dict[Any, Any] = {}
            window = self.spec.window(start)
            for key, parts in by_key.items():
                total = _fold(self.combine, parts.values())
                finals[key] = total
                out.append((key, window, total))
                for src in parts:
                    self._changes2.append((q, _encoder.encode(("o", start, key, src)), None))
                self._changes2.append(
                    (q, _encoder.encode(("c", start, key)), _encoder.encode(total))
                )
            owner.closed[start] = finals
            self.closed_windows += 1
        for start in list(owner.closed):
            if start + size + self.spec.expires_ms <= horizon:
                for key in owner.closed.pop(start):
                    self._changes2.append((q, _encoder.encode(("c", start, key)), None))
        return out

    async def emit(self, emissions: list[Emission], send: Callable[..., Any]) -> None:
        """Deliver closed windows to ``on_close`` and the ``to`` topic."""
        for key, window, value in emissions:
            if self.on_close is not None:
                result = self.on_close(key, window, value)
                if inspect.isawaitable(result):
                    await result
            if self.to is not None:
                await send(
                    self.to.name,
                    self.to.encode(
                        WindowResult(key=key, start=window.start, end=window.end, value=value)
                    ),
                    key=self.to.encode_key(key) if not isinstance(key, bytes) else key,
                )

    # -- reads ----------------------------------------------------------------------------

    def value(self, key: K, ts: int) -> V | None:
        """``key``'s value in the window containing ``ts`` (the newest one for hopping):
        final once closed; while open, the parts known on this worker."""
        start = ts - ts % self.spec.step_ms
        return self.windows(key).get(self.spec.window(start))

    def windows(self, key: K) -> dict[Window, V]:
        """Every window this worker knows for ``key``, open and closed (until expiry)."""
        out: dict[Window, Any] = {}
        q = self.partition_of(key)
        owner = self._owners.get(q)
        if owner is not None:
            for start, finals in owner.closed.items():
                if key in finals:
                    out[self.spec.window(start)] = finals[key]
            for start, by_key in owner.open.items():
                if key in by_key:
                    out[self.spec.window(start)] = _fold(self.combine, by_key[key].values())
        for p, partials in self._partials.items():
            for start, window in partials.items():
                if key in window:
                    w = self.spec.window(start)
                    if (
                        w in out
                        and owner is not None
                        and start in owner.open
                        and p in owner.open[start].get(key, {})
                    ):
                        continue  # already shipped from this source
                    out[w] = window[key] if w not in out else self.combine(out[w], window[key])
        return dict(sorted(out.items()))

    def __iter__(self) -> Iterator[K]:
        keys: set[Any] = set()
        for owner in self._owners.values():
            for finals in owner.closed.values():
                keys.update(finals)
            for by_key in owner.open.values():
                keys.update(by_key)
        for partials in self._partials.values():
            for window in partials.values():
                keys.update(window)
        return iter(sorted(keys, key=repr))

    # -- changelog ------------------------------------------------------------------------

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """Changelog records since the last drain: (partition, key, value or None)."""
        out = self._changes2
        self._changes2 = []
        for p, start, keys in self._shipped:
            for key in keys:
                out.append((p, _encoder.encode(("p", start, key)), None))
        self._shipped = []
        for p, starts in self._dirty_windows.items():
            partials = self._partials[p]
            for start in starts:
                for key, value in partials.get(start, {}).items():
                    out.append((p, _encoder.encode(("p", start, key)), _encoder.encode(value)))
            starts.clear()
        for p, wm in self._wm.items():
            state = (wm, self._max_ts[p], self._sent_wm[p])
            if wm != _NONE and self._logged_wm.get(p) != state:
                self._logged_wm[p] = state
                out.append((p, b'["w"]', _encoder.encode(state)))
        return out

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from its changelog."""
        self.assign([partition])
        partials = self._partials[partition]
        owner = self._owners[partition]
        for m in messages:
            if m.key is None:
                continue
            parts = _decode_any(m.key)
            kind = parts[0]
            value = None if m.value is None else _decode_any(m.value)
            if kind == "w":
                if value is not None:
                    self._wm[partition], self._max_ts[partition], self._sent_wm[partition] = value
            elif kind == "p":
                start, key = parts[1], self._key_from_json(parts[2])
                if value is None:
                    partials.get(start, {}).pop(key, None)
                else:
                    partials.setdefault(start, {})[key] = value
            elif kind == "o":
                start, key = parts[1], self._key_from_json(parts[2])
                if value is None:
                    owner.open.get(start, {}).pop(key, None)
                else:
                    owner.open.setdefault(start, {}).setdefault(key, {})[parts[3]] = value
            elif kind == "s":
                owner.source_wm[parts[1]] = value if value is not None else _NONE
            elif kind == "c":
                start, key = parts[1], self._key_from_json(parts[2])
                if value is None:
                    owner.closed.get(start, {}).pop(key, None)
                else:
                    owner.closed.setdefault(start, {})[key] = value
        for d in (partials, owner.open, owner.closed):
            for start in [s for s, v in d.items() if not v]:
                del d[start]
        size = self.spec.size_ms
        self._next_end[partition] = min((s + size for s in partials), default=_INF)

    def _key_from_json(self, key: Any) -> Any:
        if isinstance(key, list):
            return tuple(key)
        return key


_INF = 2**62
_MISSING: Any = object()


def _fold(combine: Callable[[Any, Any], Any], values: Iterable[Any]) -> Any:
    it = iter(values)
    total = next(it)
    for v in it:
        total = combine(total, v)
    return total


def _unset_clock() -> int:
    raise NotRunningError("windowed tables need a running worker (the wall clock comes from it)")
