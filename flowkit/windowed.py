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


class _Part:
    """Stage-1 state of one source partition."""

    __slots__ = (
        "active",
        "dirty",
        "hot",
        "hot_end",
        "hot_start",
        "logged",
        "max_ts",
        "next_end",
        "number",
        "partials",
        "sent_wm",
        "wm",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.partials: dict[int, dict[Any, Any]] = {}  # window start -> key -> partial
        self.wm = _NONE
        self.max_ts = _NONE
        self.next_end = _INF  # the earliest end among open windows
        self.sent_wm = _NONE  # the watermark last announced to the owners
        self.active = -1.0  # when the partition went quiet (monotonic), or -1 if not quiet
        self.dirty: set[int] = set()  # windows changed since the last changelog flush
        self.logged: tuple[int, int, int] | None = None
        # The window the last add() went to, already open and in ``dirty``: consecutive
        # records mostly fall in the same window. Forgotten whenever ``dirty`` is cleared
        # or a window leaves ``partials``.
        self.hot_start = self.hot_end = _NONE
        self.hot: dict[Any, Any] = {}

    def forget_hot(self) -> None:
        self.hot_start = self.hot_end = _NONE  # no time is in [_NONE, _NONE)
        self.hot = {}


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
        self.callback_errors = 0
        self.closed_windows = 0
        self.now_ms: Callable[[], int] = _unset_clock
        self._size = spec.size_ms
        self._future_limit = -(2**62)  # refreshed from the wall clock on first use
        # The common case, inlined in add(): tumbling windows summed with ``+``.
        self._tumbling_sum = spec.step_ms == spec.size_ms and combine is operator.add
        self._last: tuple[Any, _Part] = (None, _Part(-1))  # add()'s last batch, its state
        # (Keep instances at 30 attributes or fewer: past that CPython stops sharing the
        # instance dict's keys and every self.attribute read in add() gets slower.)
        # stage 1, per source partition
        self._parts: dict[int, _Part] = {}
        self._shipped: list[tuple[int, int, list[Any]]] = []  # (partition, start, keys)
        self._outbox: list[tuple[int, bytes | None, bytes]] = []
        # stage 2, per owning partition
        self._owners: dict[int, _Owner] = {}
        self._changes2: list[tuple[int, bytes, bytes | None]] = []

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
        batch = None if source is None else source.batch
        if batch is not None:
            last = self._last
            part = last[1] if batch is last[0] else self._part_of_batch(batch)
            if ts is None:
                ts = self._time_of(source)
        else:
            if ts is None:
                raise NotRunningError(
                    f"table {self.name!r}: outside an agent, add() needs ts= (event time, ms)"
                )
            held = self._parts.get(self.partition_of(key))
            if held is None:
                raise NotRunningError(f"table {self.name!r}: that partition is not held here")
            part = held
            part.active = -1.0
        if ts > part.max_ts:  # inlined _advance: event time mostly moves forward
            if ts > self._future_limit:
                self._check_future(ts)
            part.max_ts = ts
            wm = ts - self.spec.grace_ms
            if wm > part.wm:
                part.wm = wm
                if wm >= part.next_end:
                    self._close_partials(part)
        if self._tumbling_sum:  # the common case, without a loop or a call
            window: dict[Any, Any] | None
            if ts < part.hot_end and ts >= part.hot_start:
                window = part.hot  # open (so not late) and already marked dirty
            else:
                window = self._window_for_add(part, ts - ts % self._size, key, amount)
                if window is None:
                    return
            try:
                window[key] = window[key] + amount
            except KeyError:
                window[key] = amount
            return
        size = self._size
        for start in self.spec.starts(ts):
            if start + size <= part.wm:
                self._late(key, self.spec.window(start), amount)
                continue
            partial = part.partials.get(start)
            if partial is None:
                partial = self._open(part, start)
            old = partial.get(key, _MISSING)
            partial[key] = amount if old is _MISSING else self.combine(old, amount)
            part.dirty.add(start)

    def _part_of_batch(self, batch: Any) -> _Part:
        part = self._parts.get(batch.tp.partition)
        if part is None:
            raise NotRunningError(f"table {self.name!r}: that partition is not held here")
        part.active = -1.0  # a batch with adds: the partition is not quiet
        self._last = (batch, part)
        return part

    def _window_for_add(
        self, part: _Part, start: int, key: Any, amount: Any
    ) -> dict[Any, Any] | None:
        """The open window at ``start`` for add(), marked dirty and made hot; None (after
        handling the record as late) if it already closed."""
        if start + self._size <= part.wm:
            self._late(key, self.spec.window(start), amount)
            return None
        window = part.partials.get(start)
        if window is None:
            window = self._open(part, start)
        part.dirty.add(start)
        part.hot_start, part.hot_end, part.hot = start, start + self._size, window
        return window

    def _open(self, part: _Part, start: int) -> dict[Any, Any]:
        window: dict[Any, Any] = {}
        part.partials[start] = window
        end = start + self._size
        if end < part.next_end:
            part.next_end = end
        return window

    def _part_of_record(self, what: str) -> tuple[Any, _Part]:
        source = active_source()
        if source is None or source.batch is None:
            raise NotRunningError(
                f"windowed table {self.name!r}: {what} works inside an agent only; "
                "use add(key, n, ts=...) or value(key, ts=...) elsewhere"
            )
        part = self._parts.get(source.batch.tp.partition)
        if part is None:
            raise NotRunningError(f"table {self.name!r}: that partition is not held here")
        return source, part

    def __getitem__(self, key: K) -> V:
        """Inside an agent: this partition's running part of ``key`` in the current
        window (so ``counts[key] += 1`` adds 1). Use ``value()`` for the combined value."""
        source, part = self._part_of_record("table[key]")
        ts = self._time_of(source)
        window = part.partials.get(ts - ts % self.spec.step_ms, {})
        if key in window:
            return window[key]  # type: ignore[no-any-return]
        if self.default is None:
            raise KeyError(key)
        return self.default()

    def __setitem__(self, key: K, value: V) -> None:
        if self.spec.step_ms != self._size:
            # A record is in several hopping windows holding different values: one value
            # written back (``counts[k] += 1``) would be right for one window only.
            raise DefinitionError(
                f"hopping table {self.name!r}: use {self.name}.add(key, amount), which "
                "updates every window that contains the record; table[key] = value and "
                "table[key] += amount would update one of them"
            )
        source, part = self._part_of_record("table[key] = value")
        ts = self._time_of(source)
        if ts > part.max_ts:
            self._advance(part, ts)
        start = ts - ts % self.spec.step_ms
        if start + self._size <= part.wm:
            self._late(key, self.spec.window(start), value)
            return
        window = part.partials.get(start)
        if window is None:
            window = self._open(part, start)
        window[key] = value
        part.dirty.add(start)

    def _time_of(self, source: Any) -> int:
        batch = source.batch
        if self.time is not None:
            return int(self.time(source.value))
        return int(batch.messages[source.pos].timestamp)

    def _check_future(self, ts: int) -> None:
        # The limit is cached and only refreshed when a record passes it, so the wall clock
        # is read once in a while, not per record; a stale limit only causes a refresh.
        self._future_limit = self.now_ms() + self.spec.max_future_ms
        if ts > self._future_limit:
            raise FutureRecord(
                f"event time {ts} is more than {self.spec.max_future_ms} ms ahead of the "
                f"wall clock; table {self.name!r} does not let it move the watermark"
            )

    def _advance(self, part: _Part, ts: int) -> None:
        if ts > self._future_limit:
            self._check_future(ts)
        part.max_ts = ts
        wm = ts - self.spec.grace_ms
        if wm > part.wm:
            part.wm = wm
            if wm >= part.next_end:
                self._close_partials(part)

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

    def _close_partials(self, part: _Part) -> None:
        """Ship every window that ended at or before the watermark to its owners."""
        wm = part.wm
        size = self._size
        p = part.number
        next_end = _INF
        part.forget_hot()
        for start in sorted(part.partials):
            if start + size > wm:
                next_end = min(next_end, start + size)
                continue
            window = part.partials.pop(start)
            for key, value in window.items():
                self._outbox.append(
                    (
                        self.partition_of(key),
                        self.encode_key(key),
                        _encoder.encode(("p", start, p, key, value)),
                    )
                )
            self._shipped.append((p, start, list(window)))
            part.dirty.discard(start)
        part.next_end = next_end

    # -- the worker's side: stage 1 --------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these partitions (as source and as owner)."""
        for p in partitions:
            if p not in self._parts:
                self._parts[p] = _Part(p)
                self._owners[p] = _Owner(self.partitions)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        self._last = (None, _Part(-1))
        for p in partitions:
            self._parts.pop(p, None)
            self._owners.pop(p, None)

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self._parts)

    def tick(self, now: float, caught_up: set[int]) -> None:
        """Idle handling: a caught-up partition with no adds for ``idle_timeout`` seconds
        moves its watermark to the wall clock minus grace."""
        for p, part in self._parts.items():
            if p not in caught_up:
                part.active = -1.0
            elif part.active < 0:
                part.active = now
            elif now - part.active >= self.idle_timeout:
                wm = self.now_ms() - self.spec.grace_ms
                if wm > part.wm:
                    part.wm = wm
                    if wm >= part.next_end:
                        self._close_partials(part)

    def drain_outbox(self) -> list[tuple[int, bytes | None, bytes]]:
        """Partials and watermark markers to send: (partition, key, value)."""
        for p, part in self._parts.items():
            if self._announce(part):
                part.sent_wm = part.wm
                marker = _encoder.encode(("w", part.wm, p, None, None))
                self._outbox.extend((q, None, marker) for q in range(self.partitions))
        out, self._outbox = self._outbox, []
        return out

    def requeue_outbox(self, items: list[tuple[int, bytes | None, bytes]]) -> None:
        """Put back, in front, what ``drain_outbox`` gave and was not sent."""
        self._outbox[:0] = items

    def has_outbox(self) -> bool:
        """True when partials or markers wait to be sent."""
        if self._outbox:
            return True
        return any(self._announce(part) for part in self._parts.values())

    def _announce(self, part: _Part) -> bool:
        # A marker only when the watermark crosses a window boundary: owners can close
        # nothing new in between, so one marker per window per partition is enough.
        if part.wm == _NONE:
            return False
        step = self.spec.step_ms
        return part.sent_wm == _NONE or part.wm // step > part.sent_wm // step

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
                try:
                    result = self.on_close(key, window, value)
                    if inspect.isawaitable(result):
                        await result
                except Exception as exc:
                    # The window is closed either way (and goes to `to=` below); a callback
                    # that fails is logged with the value it was given, never retried.
                    self.callback_errors += 1
                    log.error(
                        "on_close callback failed",
                        table=self.name,
                        key=key,
                        window_start=window.start,
                        value=value,
                        error=repr(exc),
                    )
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
        for p, part in self._parts.items():
            for start, window in part.partials.items():
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
        for part in self._parts.values():
            for window in part.partials.values():
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
        for p, part in self._parts.items():
            for start in part.dirty:
                for key, value in part.partials.get(start, {}).items():
                    out.append((p, _encoder.encode(("p", start, key)), _encoder.encode(value)))
            part.dirty.clear()
            part.forget_hot()
            state = (part.wm, part.max_ts, part.sent_wm)
            if part.wm != _NONE and part.logged != state:
                part.logged = state
                out.append((p, b'["w"]', _encoder.encode(state)))
        return out

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild both stages of ``partition`` from its changelog."""
        self.assign([partition])
        part = self._parts[partition]
        partials = part.partials
        owner = self._owners[partition]
        for m in messages:
            if m.key is None:
                continue
            parts = _decode_any(m.key)
            kind = parts[0]
            value = None if m.value is None else _decode_any(m.value)
            if kind == "w":
                if value is not None:
                    part.wm, part.max_ts, part.sent_wm = value
                    part.logged = tuple(value)
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
        part.next_end = min((s + self._size for s in partials), default=_INF)
        part.forget_hot()

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
