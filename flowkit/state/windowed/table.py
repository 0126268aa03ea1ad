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

Watermark: per source partition, the largest event time seen (its stream time, which
every record an agent reads moves, added or filtered out: ``follow``) minus ``grace``. A record
whose window has already closed on its partition is late: it is counted, logged, and
raised as ``LateRecord`` (so it goes to the dead-letter topic) unless ``late="drop"`` or
a callable. A partition that has caught up and sees no records for ``idle_timeout``
seconds moves its watermark to the wall clock minus grace, so quiet partitions do not
hold windows open for ever.

A table may be declared with an aggregation (``aggregate=``, ``flowkit.aggregations``)
instead of the agent writing its values, and with ``emit_on="update"`` to emit each change
of an open window's value, not only the final one: sources then ship the partials that
changed at every flush, and owners emit the combined value when it changes. Both run in a
copy of ``add`` made for the table (``_adds.py``), so a plain table pays nothing for them.

This module is the declaration and the per-record ``add``; the state is in a
``WindowedStore`` per worker (``stage1.py``, ``owner.py``, ``store.py``), and what goes
over the wire is in ``wire.py``.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

import structlog

from ... import arguments
from ...aggregations import Aggregation
from ...durations import Seconds, optional_seconds
from ...errors import DefinitionError, LateRecord, NotRunningError
from ...scope import TaskScope, current_scope, require_scope
from ...topics import Topic
from ...windows import Window, WindowSpec
from ..base import TableBase
from ..local import StoreKind
from ._adds import specialised
from .owner import Emission
from .results import EMIT_ON, ON_ERROR, deliver_closed, deliver_late
from .stages import TwoStages
from .store import WindowedStore
from .windowset import WindowSet

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

    With ``aggregate=`` the table declares what its value is, and the agent passes each
    record to ``add``; with ``emit_on="update"`` every change goes out, not only the final
    value (``on_update``, ``to=``):

    >>> totals = app.table("totals").tumbling(
    ...     10.0, aggregate=flowkit.Sum("cents"), emit_on="update", on_update=print
    ... )
    >>> totals.describe()["aggregate"], totals.describe()["emit_on"]
    ('sum(cents)', 'update')
    """

    kind = "windowed_table"
    # "memory://" or "rocksdb://" (tumbling and hopping windows); None: the app's.
    store_kind: StoreKind | None = None
    # What a running update notes as changed in a part's ``changed`` (see _adds.py);
    # None: the kind's add notes nothing (its owner sees every record).
    changed_entry: ClassVar[str | None] = "(start, key)"

    def __init__(
        self,
        name: str,
        *,
        spec: WindowSpec,
        combine: Callable[[V, V], V] = operator.add,
        on_close: Callable[[K, Window, V], Any] | None = None,
        to: Topic[Any] | None = None,
        time: Callable[[Any], int] | None = None,
        late: str | Callable[[K, Window, Any], Any] | Topic[Any] = "dlq",
        idle_timeout: Seconds | None = 30.0,
        emit: Callable[..., Any] | None = None,
        on_error: str = "dead_letter",
        aggregate: Aggregation | None = None,
        emit_on: str = "close",
        on_update: Callable[[K, Window, Any, bool], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        what = f"table {name!r}"
        arguments.function(combine, f"{what}: combine")
        for option, fn in (
            ("on_close", on_close),
            ("time", time),
            ("emit", emit),
            ("on_update", on_update),
        ):
            if fn is not None:
                arguments.function(fn, f"{what}: {option}")
        _check_emit_on(what, emit_on, on_update, emit)
        if aggregate is not None:
            combine = _check_aggregate(what, aggregate, combine, spec, self.partitions)
        if to is not None and not isinstance(to, Topic):
            raise DefinitionError(
                f"{what}: to must be a topic declared with app.topic(), not {arguments.shown(to)}"
            )
        if late not in ("dlq", "drop") and not callable(late) and not isinstance(late, Topic):
            raise DefinitionError(
                f"table {name!r}: late must be 'dlq', 'drop', a topic or a callable"
            )
        if on_error not in ON_ERROR:
            raise DefinitionError(
                f"table {name!r}: on_error must be 'dead_letter', 'log' or 'stop', not {on_error!r}"
            )
        if emit is not None and to is None:
            raise DefinitionError(f"table {name!r}: emit= makes the records of to=; give to=")
        self.spec = spec
        self.combine = combine
        self.aggregation = aggregate
        self.emit_on = emit_on
        self.on_update = on_update
        self.on_close = on_close
        # An on_close with a ``replayed`` parameter is told which results a restart emits
        # again; one without is called as before.
        self.on_close_replayed = on_close is not None and _takes_replayed(on_close)
        self.to = to
        self.emit_fn = emit
        self.on_error = on_error
        # A topic or an async callable cannot be served inside add(): the late record
        # waits in the store for the worker's next flush (see results.py).
        self._late_deferred = isinstance(late, Topic) or inspect.iscoroutinefunction(late)
        self.time = time
        self.late = late
        self.idle_timeout = optional_seconds(idle_timeout, f"table {name!r}: idle_timeout")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise DefinitionError(
                f"table {name!r}: idle_timeout must be > 0 seconds (None: never), "
                f"not {self.idle_timeout}"
            )
        self._size = spec.size_ms
        self._grace = spec.grace_ms
        # The common case, inlined in add(): tumbling windows summed with ``+`` (a declared
        # count or sum too), when no update is to be noted per add.
        self._tumbling_sum = (
            spec.step_ms == spec.size_ms
            and combine is operator.add
            and (aggregate is None or aggregate.lifted)
            and emit_on == "close"
        )
        if aggregate is not None or (emit_on == "update" and self.changed_entry is not None):
            # This table's add lifts or folds with the aggregation and notes updates, in
            # a copy of add made for it; a plain table runs add itself (see _adds.py).
            self.__class__ = specialised(type(self), aggregate, emit_on == "update")

    @property
    def repartition_topic(self) -> str:
        """The internal topic that carries partials to their owners."""
        return f"{self.app_name}-{self.name}-repartition"

    def describe(self) -> dict[str, object]:
        described = {**super().describe(), **self.spec.describe(), "emit_on": self.emit_on}
        if self.aggregation is not None:
            described["aggregate"] = self.aggregation.name
        described["repartition"] = self.repartition_topic
        return described

    def new_store(self, now_ms: Callable[[], int]) -> WindowedStore:
        return WindowedStore(self, now_ms)

    def store(self) -> WindowedStore:
        """The store of the worker running the calling task."""
        return require_scope(f"table {self.name!r}").stores[self]  # type: ignore[no-any-return]

    # -- stage 1: adds in agents ----------------------------------------------------------

    def add(self, key: K, amount: V, ts: int | None = None) -> None:
        """Combine ``amount`` into ``key``'s value in the window(s) containing ``ts``.

        ``ts`` is event time in milliseconds; without it the time comes from the record the
        agent is processing (the table's ``time`` function, else the record timestamp).
        ``add(key, 1, t)`` and ``add(key, 1, ts=t)`` are the same; the positional form is
        the cheaper call on CPython 3.11, which runs a keyword call to a Python function
        through a slower, unspecialised path.
        """
        scope = current_scope()
        try:
            memo = scope.batch.memo  # type: ignore[union-attr]
        except AttributeError:  # no worker, or no record (a timer, a task): found below
            memo = None
        if memo is None or memo[0] is not self:
            memo, ts = self._locate(scope, key, ts)
        elif ts is None:
            ts = self._time_of(scope)
        # (here a declared aggregation's lift of amount, in its specialised add: _adds.py)
        # memo: (self, the store, the partition's state), found once per batch.
        part = memo[2]
        # The common case in two comparisons (event times in ms are big integers, which
        # CPython 3.11 compares on its slow generic path): a time in the hot window (open,
        # marked dirty; a tumbling sum's only) and not newer than any seen, so the
        # watermark does not move.
        if ts <= part.hot_top and ts >= part.hot_start:
            window: dict[Any, Any] = part.hot
            try:
                window[key] = window[key] + amount
            except KeyError:
                window[key] = amount
            return
        if ts > part.max_ts:  # inlined Stage1.advance: event time mostly moves forward
            st: WindowedStore = memo[1]
            if ts > st.future_limit:
                st.check_future(ts)
            part.max_ts = ts
            wm = ts - self._grace
            if wm > part.wm:
                part.wm = wm
                if wm >= part.next_end:
                    memo[1].close_partials(part)
        if self._tumbling_sum:  # the common case, without a loop or a call
            if ts < part.hot_end and ts >= part.hot_start:
                window = part.hot  # open (so not late) and already marked dirty
                part.hot_top = ts  # the newest time seen (above hot_top, so it moved max_ts)
            else:
                start = ts - ts % self._size
                if start + self._size <= part.wm:
                    self._late(memo[1], key, start, amount)
                    return
                window = memo[1].window_for_add(part, start, key, amount)
            try:
                window[key] = window[key] + amount
            except KeyError:
                window[key] = amount
            return
        st = memo[1]
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
            # (here running updates mark the key changed, in a specialised add: _adds.py)

    def _locate(self, scope: Any, key: Any, ts: int | None) -> tuple[Any, int]:
        # add()'s (self, store, partition state) and time when the batch's memo does not
        # have them: the first add of a batch, or an add outside an agent.
        if scope is None:
            raise NotRunningError(
                f"table {self.name!r}: add() works inside a running worker (outside an agent "
                "it also needs ts=, the event time in ms)"
            )
        batch = scope.batch
        if batch is None:
            if ts is None:
                raise NotRunningError(
                    f"table {self.name!r}: outside an agent, add() needs ts= (event time, ms)"
                )
            st = scope.stores[self]
            return (self, st, st.part_of_key(key)), ts
        memo = batch.memo
        if memo is None or memo[0] is not self:
            st = scope.stores[self]
            memo = batch.memo = (self, st, st.part_of_batch(batch))
            if self.time is not None or ts is None:
                # This stream now moves the table's stream time with every record it
                # reads, added or filtered out (see follow()); once per batch.
                scope.follow(self, st)
        return memo, self._time_of(scope) if ts is None else ts

    def follow(self, st: WindowedStore, batch: Any) -> None:
        """Stream time: the last record of a batch an agent has finished (added or
        filtered out) moves its partition's watermark, as every record read does in Kafka
        Streams, so windows close on the data alone. Called once per batch, not per record.

        The time is the table's ``time`` function of that record's value, or its timestamp
        when the agent's adds take the time from the record. A value the function cannot
        read, or a time too far in the future, leaves stream time where it is.
        """
        part = st.parts.get(batch.tp.partition)
        if part is None:
            return
        part.active = -1.0  # records arrive: the partition is not quiet
        last = batch.messages[-1]
        if self.time is not None:
            try:
                ts = int(self.time(batch.decode(last.value)))
            except Exception:
                return  # not a value of this table (another topic of the agent)
        else:
            ts = int(last.timestamp)
        if ts > part.max_ts:
            if ts > st.future_limit and not st.admits(ts):
                return  # bad input: the record's own add() dead-letters it
            st.advance(part, ts)

    def _time_of(self, scope: Any) -> int:
        if self.time is not None:
            return int(self.time(scope.value))
        return scope.event_time()  # type: ignore[no-any-return]

    def _late(self, st: TwoStages[Any], key: K, start: int, amount: Any) -> None:
        st.late_records += 1
        window = self.spec.window(start)
        log.debug("late record", table=self.name, key=key, window_start=window.start)
        if self.late == "drop":
            return
        if self._late_deferred:
            scope = current_scope()
            current = getattr(scope, "current_message", None)
            message = current() if current is not None else None
            if message is not None or callable(self.late):
                st.late_out.append((key, window, amount, message))
                return
        elif callable(self.late):
            self.late(key, window, amount)
            return
        raise LateRecord(
            f"record for window {window} ({self.spec.bounds(window)} ms) of table "
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
        scope.follow(self, st)
        return scope, st, part

    def __getitem__(self, key: K) -> WindowSet[K, V]:
        """``key`` across its windows, as in Faust: ``table[key].current()``, ``.now()``,
        ``.delta(seconds)``, ``.value(ts)``; and ``table[key] += n`` adds ``n``."""
        return WindowSet(self, key)

    def record_time(self, what: str) -> int:
        """The event time of the record the calling agent is processing."""
        scope = current_scope()
        if scope is None or scope.batch is None:
            raise NotRunningError(
                f"windowed table {self.name!r}: table[key].{what} reads the window of the "
                "record being processed, inside an agent; elsewhere use table[key].now() "
                "or table[key].value(ts)"
            )
        return self._time_of(scope)

    def __setitem__(self, key: K, value: V | WindowSet[K, V]) -> None:
        if type(value) is WindowSet and value.table is self:
            if value.key == key:
                return  # the end of ``table[key] += n``: add() has already done it
            raise DefinitionError(
                f"table {self.name!r}: table[a] = table[b] copies no value; read one "
                "with table[b].current() or .value(ts)"
            )
        if self.aggregation is not None:
            raise DefinitionError(
                f"table {self.name!r} aggregates with {self.aggregation}: "
                f"table[key] = value would replace its accumulator; use {self.name}.add(key, value)"
            )
        if self.spec.step_ms != self._size:
            # A record is in several hopping windows holding different values: one value
            # written back (``counts[k] += 1``) would be right for one window only.
            raise DefinitionError(
                f"hopping table {self.name!r}: table[key] = value would set one of the "
                f"record's windows; use {self.name}.add(key, amount) (or +=), which "
                "updates every window that contains the record"
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
        if part.changed is not None:
            part.changed.add((start, key))

    # -- closed windows -------------------------------------------------------------------

    async def emit(
        self,
        store: WindowedStore,
        emissions: list[Emission],
        send: Callable[..., Any],
        dlq: str = "",
        *,
        final: bool = True,
        replayed: bool = False,
    ) -> None:
        """Deliver closed windows (``final``) or running updates to ``on_close``,
        ``on_update`` and the ``to`` topic; a failure follows ``on_error`` (``dlq``: the
        app's dead-letter topic); ``replayed``: a restart emits them again. See
        ``results.py``."""
        if self.aggregation is not None and self.aggregation.result is not None:
            finish = self.aggregation.result
            emissions = [(key, window, finish(acc)) for key, window, acc in emissions]
        dlq = dlq or f"{self.app_name}-dlq"
        await deliver_closed(self, store, emissions, send, dlq, final=final, replayed=replayed)

    async def deliver_late(self, store: WindowedStore, send: Callable[..., Any]) -> None:
        """Late records waiting for the ``late`` topic or async callable."""
        await deliver_late(self, store, send)

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


def _check_emit_on(
    what: str, emit_on: object, on_update: object, emit: Callable[..., Any] | None
) -> None:
    if emit_on not in EMIT_ON:
        raise DefinitionError(
            f"{what}: emit_on must be 'close' or 'update', not {arguments.shown(emit_on)}"
        )
    if emit_on == "close":
        if on_update is not None:
            raise DefinitionError(f"{what}: on_update is called with emit_on='update' only")
        return
    for option, fn in (("on_update", on_update), ("emit", emit)):
        if callable(fn) and not _takes(fn, 4):
            raise DefinitionError(
                f"{what}: with emit_on='update', {option} is called with "
                "(key, window, value, final)"
            )


def _takes(fn: Callable[..., Any], n: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): called as it is
        return True
    return True


def _check_aggregate(
    what: str,
    aggregate: object,
    combine: Callable[[Any, Any], Any],
    spec: WindowSpec,
    partitions: int,
) -> Callable[[Any, Any], Any]:
    """The table's combine (the owner's merge of partials) for a declared aggregation."""
    if not isinstance(aggregate, Aggregation):
        raise DefinitionError(
            f"{what}: aggregate must be an aggregation such as flowkit.Count() or "
            f"flowkit.Aggregation(initial, add, merge), not {arguments.shown(aggregate)}"
        )
    if combine is not operator.add:
        raise DefinitionError(f"{what}: give aggregate= or combine=, not both")
    if aggregate.merge is not None:
        return aggregate.merge
    if spec.requires_merge:
        why = f"{spec.kind} windows merge accumulators"
    elif partitions > 1:
        why = f"its {partitions} partitions' partials are merged"
    else:
        return _no_merge
    raise DefinitionError(
        f"{what}: aggregate {aggregate} has no merge, and {why}; "
        "give flowkit.Aggregation(initial, add, merge)"
    )


def _no_merge(a: Any, b: Any) -> Any:  # pragma: no cover - one partition merges nothing
    raise DefinitionError("this aggregation has no merge")


def _takes_replayed(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` has a parameter named ``replayed``.

    >>> _takes_replayed(lambda key, window, value, replayed=False: None)
    True
    >>> _takes_replayed(print)
    False
    """
    try:
        return "replayed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
