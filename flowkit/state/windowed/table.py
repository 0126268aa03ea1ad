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

This module is the declaration and the per-record ``add``; the state is in a
``WindowedStore`` per worker (``stage1.py``, ``owner.py``, ``store.py``), and what goes
over the wire is in ``wire.py``.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from ...errors import DefinitionError, LateRecord, NotRunningError
from ...scope import TaskScope, current_scope, require_scope
from ...windows import Window, WindowResult, WindowSpec
from ..base import TableBase
from .owner import Emission
from .store import WindowedStore

if TYPE_CHECKING:
    from ...topics import Topic

__all__ = ["WindowedTable"]

K = TypeVar("K")
V = TypeVar("V")

log = structlog.get_logger(__name__)


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
        self._size = spec.size_ms
        self._grace = spec.grace_ms
        # The common case, inlined in add(): tumbling windows summed with ``+``.
        self._tumbling_sum = spec.step_ms == spec.size_ms and combine is operator.add

    @property
    def repartition_topic(self) -> str:
        """The internal topic that carries partials to their owners."""
        return f"{self.app_name}-{self.name}-repartition"

    def describe(self) -> dict[str, object]:
        return {**super().describe(), **self.spec.describe(), "repartition": self.repartition_topic}

    def new_store(self, now_ms: Callable[[], int]) -> WindowedStore:
        return WindowedStore(self, now_ms)

    def store(self) -> WindowedStore:
        """The store of the worker running the calling task."""
        return require_scope(f"table {self.name!r}").stores[self]  # type: ignore[no-any-return]

    # -- stage 1: adds in agents ----------------------------------------------------------

    def add(self, key: K, amount: V, *, ts: int | None = None) -> None:
        """Combine ``amount`` into ``key``'s value in the window(s) containing ``ts``.

        ``ts`` is event time in milliseconds; without it the time comes from the record the
        agent is processing (the table's ``time`` function, else the record timestamp).
        """
        scope = current_scope()
        if scope is None:
            raise NotRunningError(
                f"table {self.name!r}: add() works inside a running worker (outside an agent "
                "it also needs ts=, the event time in ms)"
            )
        batch = scope.batch
        st: WindowedStore
        if batch is not None:
            # The store and its partition state, found once per batch (memo on the batch).
            memo = batch.memo
            if memo is not None and memo[0] is self:
                _, st, part = memo
            else:
                st = scope.stores[self]
                part = st.part_of_batch(batch)
                batch.memo = (self, st, part)
            if ts is None:
                ts = self._time_of(scope)
        else:
            if ts is None:
                raise NotRunningError(
                    f"table {self.name!r}: outside an agent, add() needs ts= (event time, ms)"
                )
            st = scope.stores[self]
            part = st.part_of_key(key)
        if ts > part.max_ts:  # inlined Stage1.advance: event time mostly moves forward
            if ts > st.future_limit:
                st.check_future(ts)
            part.max_ts = ts
            wm = ts - self._grace
            if wm > part.wm:
                part.wm = wm
                if wm >= part.next_end:
                    st.close_partials(part)
        if self._tumbling_sum:  # the common case, without a loop or a call
            window: dict[Any, Any]
            if ts < part.hot_end and ts >= part.hot_start:
                window = part.hot  # open (so not late) and already marked dirty
            else:
                start = ts - ts % self._size
                if start + self._size <= part.wm:
                    self._late(st, key, start, amount)
                    return
                window = st.window_for_add(part, start, key, amount)
            try:
                window[key] = window[key] + amount
            except KeyError:
                window[key] = amount
            return
        for start in self.spec.starts(ts):
            if start + self._size <= part.wm:
                self._late(st, key, start, amount)
                continue
            partial = part.partials.get(start)
            if partial is None:
                partial = st.open(part, start)
            old = partial.get(key, _MISSING)
            partial[key] = amount if old is _MISSING else self.combine(old, amount)
            part.dirty.add(start)

    def _time_of(self, scope: Any) -> int:
        if self.time is not None:
            return int(self.time(scope.value))
        return scope.event_time()  # type: ignore[no-any-return]

    def _late(self, st: WindowedStore, key: K, start: int, amount: Any) -> None:
        st.late_records += 1
        window = self.spec.window(start)
        log.debug("late record", table=self.name, key=key, window_start=window.start)
        if self.late == "drop":
            return
        if callable(self.late):
            self.late(key, window, amount)
            return
        raise LateRecord(
            f"record for window {window} ([{window.start}, {window.end}) ms) of table "
            f"{self.name!r} arrived after the window closed on its partition"
        )

    def _record_scope(self, what: str) -> tuple[TaskScope, WindowedStore, Any]:
        scope = current_scope()
        if scope is None or scope.batch is None:
            raise NotRunningError(
                f"windowed table {self.name!r}: {what} works inside an agent only; "
                "use add(key, n, ts=...) or value(key, ts=...) elsewhere"
            )
        st: WindowedStore = scope.stores[self]
        part = st.parts.get(scope.batch.tp.partition)
        if part is None:
            raise NotRunningError(f"table {self.name!r}: that partition is not held here")
        return scope, st, part

    def __getitem__(self, key: K) -> V:
        """Inside an agent: this partition's running part of ``key`` in the current
        window (so ``counts[key] += 1`` adds 1). Use ``value()`` for the combined value."""
        scope, _, part = self._record_scope("table[key]")
        ts = self._time_of(scope)
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
        scope, st, part = self._record_scope("table[key] = value")
        ts = self._time_of(scope)
        if ts > part.max_ts:
            st.advance(part, ts)
        start = ts - ts % self.spec.step_ms
        if start + self._size <= part.wm:
            self._late(st, key, start, value)
            return
        window = part.partials.get(start)
        if window is None:
            window = st.open(part, start)
        window[key] = value
        part.dirty.add(start)

    # -- closed windows -------------------------------------------------------------------

    async def emit(
        self, store: WindowedStore, emissions: list[Emission], send: Callable[..., Any]
    ) -> None:
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
                    store.callback_errors += 1
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
        return self.store().windows(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self.store())

    @property
    def late_records(self) -> int:
        """Late records this worker has seen (counted per worker)."""
        return self.store().late_records

    @property
    def closed_windows(self) -> int:
        """Windows this worker closed."""
        return self.store().closed_windows

    @property
    def callback_errors(self) -> int:
        """``on_close`` calls that raised in this worker."""
        return self.store().callback_errors


_MISSING: Any = object()
