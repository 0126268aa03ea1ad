"""Tables: partitioned key -> value state, in memory, backed by a changelog topic.

A ``Table`` is partitioned like the topics that feed it (co-partitioning): key ``k`` lives
in partition ``partition_for_key(k)``, the same partition Kafka's producer would put a
record with that key in. Each partition's state is a dict. Changes are buffered and the
latest value per changed key is written to the changelog ``<app>-<table>-changelog`` once
per checkpoint, before offsets are committed; when a partition is assigned, its dict is
rebuilt from the changelog before any record of that partition is processed.

A ``GlobalTable`` is held whole by every worker, fed from its own topic: reference data
such as an ad -> campaign mapping.

These are declarations: the state lives in one store per worker (``flowkit.stores``), and
``table[key]`` reads or writes the store of the worker running the calling task.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..durations import Seconds
from ..errors import DefinitionError
from ..scope import current_scope, require_scope
from ..streamtime import DEFAULT_MAX_FUTURE, max_future_ms
from ..windows import HoppingWindow, SessionWindow, SlidingWindow, TumblingWindow, WindowSpec
from .base import TableBase
from .expiry import ttl_ms
from .local import StoreKind, check_store
from .stores import GlobalStore, TableStore
from .windowed import WindowedTable
from .windowed.session_table import SessionTable
from .windowed.sliding_table import SlidingTable

if TYPE_CHECKING:
    from ..topics import Topic

__all__ = ["GlobalTable", "Table"]

K = TypeVar("K")
V = TypeVar("V")


class Table(TableBase[K, V]):
    """A partitioned table, read and written like a dict from agents.

    ``table[key] += 1`` inside an agent updates the partition that owns ``key``; that must
    be the partition of the record being processed, or the update would live on the wrong
    worker after a rebalance (re-key the stream with ``topic.group_by`` first).

    >>> import flowkit
    >>> app = flowkit.App("shop", partitions=4)
    >>> totals = app.table("totals", default=int)
    >>> totals.changelog_topic
    'shop-totals-changelog'
    """

    def __init__(
        self,
        name: str,
        *,
        check_open: Callable[[], None] = lambda: None,
        store: str | None = None,
        ttl: Seconds | None = None,
        ttl_clock: str = "event",
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self._check_open = check_open
        # "memory://" or "rocksdb://"; None: the app's (``App(store=...)``).
        self.store_kind: StoreKind | None = (
            None if store is None else check_store(store, f"table {name!r}")
        )
        self.windowed_as: WindowedTable[K, V] | None = None
        # Key expiry (``flowkit.state.expiry``): milliseconds, or None (keys stay).
        self.ttl_ms: int | None = None
        self.ttl_clock = ttl_clock
        self.max_future_ms = max_future_ms(max_future, f"table {name!r}")
        if ttl is not None:
            self.ttl_ms = ttl_ms(ttl, ttl_clock, f"table {name!r}")
            if ttl_clock == "event":
                # Writes take the time of the record being processed: only this table's
                # writes pay for it, the others keep the plain path.
                self._write_partition = self._write_timed  # type: ignore[method-assign]
        elif ttl_clock != "event":
            raise DefinitionError(f"table {name!r}: ttl_clock= needs a ttl=")

    def new_store(self, now_ms: Callable[[], int]) -> TableStore[K, V]:
        return TableStore(self, now_ms=now_ms)

    def describe(self) -> dict[str, object]:
        """Graph attributes (with the ttl, when keys expire)."""
        out = super().describe()
        if self.ttl_ms is not None:
            out["ttl"] = f"{self.ttl_ms / 1000:g}s ({self.ttl_clock} time)"
        return out

    def tumbling(
        self,
        size: Seconds,
        *,
        grace: Seconds | None = None,
        expires: Seconds | None = None,
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        **options: Any,
    ) -> WindowedTable[K, V]:
        """This table as tumbling windows of ``size`` seconds (see ``WindowedTable``)."""
        spec = TumblingWindow(size, grace=grace, expires=expires, max_future=max_future)
        return self._windowed(spec, **options)

    def hopping(
        self,
        size: Seconds,
        step: Seconds,
        *,
        grace: Seconds | None = None,
        expires: Seconds | None = None,
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        **options: Any,
    ) -> WindowedTable[K, V]:
        """This table as windows of ``size`` seconds starting every ``step`` seconds."""
        spec = HoppingWindow(size, step=step, grace=grace, expires=expires, max_future=max_future)
        return self._windowed(spec, **options)

    def session(
        self,
        gap: Seconds,
        *,
        grace: Seconds | None = None,
        expires: Seconds | None = None,
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        **options: Any,
    ) -> SessionTable[K, V]:
        """This table as session windows: a key's records closer than ``gap`` seconds
        form one session (see ``SessionTable``). ``combine=`` or ``aggregate=`` is
        required."""
        spec = SessionWindow(gap, grace=grace, expires=expires, max_future=max_future)
        if options.get("combine") is None and options.get("aggregate") is None:
            raise DefinitionError(
                f"table {self.name!r}: session windows merge sessions, so session() needs "
                "combine=, a function of two values (operator.add for counts and sums), "
                "or aggregate= (flowkit.Count() and others)"
            )
        table = self._windowed(spec, kind=SessionTable, **options)
        assert isinstance(table, SessionTable)
        return table

    def sliding(
        self,
        size: Seconds,
        *,
        grace: Seconds | None = None,
        expires: Seconds | None = None,
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        **options: Any,
    ) -> SlidingTable[K, V]:
        """This table as sliding windows of ``size`` seconds, set by the records: the
        value over the last ``size`` at every record (see ``SlidingTable``)."""
        spec = SlidingWindow(size, grace=grace, expires=expires, max_future=max_future)
        table = self._windowed(spec, kind=SlidingTable, **options)
        assert isinstance(table, SlidingTable)
        return table

    def _windowed(
        self, spec: WindowSpec, kind: type[WindowedTable[K, V]] = WindowedTable, **options: Any
    ) -> WindowedTable[K, V]:
        self._check_open()
        if self.windowed_as is not None:
            raise DefinitionError(f"table {self.name!r} is already windowed")
        if self.ttl_ms is not None:
            raise DefinitionError(
                f"table {self.name!r}: windows expire with expires=, not ttl=; "
                "declare the windowed table without ttl="
            )
        taken = _window_options()
        for option in options:
            if option not in taken:
                raise DefinitionError(
                    f"table {self.name!r}: {spec.kind}() has no option {option!r} "
                    f"(it takes {', '.join(taken)})"
                )
        # The app lists the windowed form in this table's place (App.tables).
        self.windowed_as = kind(
            self.name,
            spec=spec,
            app_name=self.app_name,
            partitions=self.partitions,
            default=self.default,
            key_type=self.key_type,
            value_type=self.value_type,
            **options,
        )
        # Where its state lives: this declaration's store, else the app's.
        self.windowed_as.store_kind = self.store_kind
        return self.windowed_as

    # -- dict interface, on the calling worker's store ------------------------------------

    def _write_partition(self, key: K) -> dict[K, V]:
        scope = require_scope(f"table {self.name!r}: writing")
        p = self.partition_of(key)
        batch = scope.batch
        if batch is not None:
            tp = batch.tp
            if tp.partition != p:
                raise self._wrong_partition(key, p, tp)
        store: TableStore[K, V] = scope.stores[self]
        return store.writable(p, key)

    def _wrong_partition(self, key: K, p: int, tp: Any) -> DefinitionError:
        return DefinitionError(
            f"table {self.name!r}: key {key!r} belongs to partition {p}, but the "
            f"record being processed came from {tp.topic}/{tp.partition}; re-key "
            "the stream so that the table key is the record key "
            "(@app.agent(topic.group_by(key_fn, name=...)))"
        )

    def _write_timed(self, key: K) -> dict[K, V]:
        """``_write_partition`` for a table whose keys expire on event time: the write
        is stamped with the time of the record being processed (with the partition's
        stream time outside an agent), and every record the agent reads moves stream
        time (``follow``)."""
        scope = current_scope()
        if scope is None:  # the message is built only here: writes are per record
            scope = require_scope(f"table {self.name!r}: writing")
        store: TableStore[K, V] = scope.stores[self]
        p = self.partition_of(key)
        batch = scope.batch
        ts = None
        if batch is not None:
            tp = batch.tp
            if tp.partition != p:
                raise self._wrong_partition(key, p, tp)
            ts = scope.event_time()  # type: ignore[attr-defined]
            guard = store.guard
            if ts > guard.future_limit and not guard.admits(ts):
                raise guard.future_record(ts)  # the record is dead-lettered, nothing moves
            scope.follow(self, store)
        data = store.writable(p, key)
        store.touch(p, key, ts)
        return data

    def follow(self, store: TableStore[K, V], batch: Any) -> None:
        """Stream time of a table with an event-time ttl: the last record of each batch
        an agent that writes the table has finished moves its partition's stream time
        (once per batch, not per record); a time beyond ``max_future`` does not."""
        messages = batch.messages
        if not messages:
            return
        ts = int(messages[-1].timestamp)
        guard = store.guard
        if ts > guard.future_limit and not guard.admits(ts):
            return
        store.advance(batch.tp.partition, ts)

    def __getitem__(self, key: K) -> V:
        return self.store()[key]  # type: ignore[no-any-return]

    def __setitem__(self, key: K, value: V) -> None:
        self._write_partition(key)[key] = value

    def __delitem__(self, key: K) -> None:
        del self._write_partition(key)[key]

    def __contains__(self, key: object) -> bool:
        return key in self.store()

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default`` (the table's default is not used)."""
        return self.store().get(key, default)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[K]:
        return iter(self.store())

    def __len__(self) -> int:
        return len(self.store())

    def items(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs of the partitions this worker holds."""
        return self.store().items()  # type: ignore[no-any-return]


class GlobalTable(TableBase[K, V]):
    """A table every worker holds whole, fed from its topic; read-only in agents.

    Fill it by producing to its topic (``await table.put(key, value)`` in a task, or any
    Kafka producer), or give ``loader``: a function returning ``(key, value)`` pairs that
    the worker produces at start when the topic is empty. A worker reads the whole topic
    before its agents process anything, then follows updates.
    """

    kind = "global_table"

    def __init__(
        self,
        name: str,
        *,
        topic: Topic[Any],
        loader: Callable[[], Iterable[tuple[K, V]]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.topic = topic
        self.loader = loader

    def new_store(self, now_ms: Callable[[], int]) -> GlobalStore[K, V]:
        return GlobalStore(self)

    @property
    def changelog_topic(self) -> str:
        """A global table's changelog is its own topic."""
        return self.topic.name

    def __getitem__(self, key: K) -> V:
        # An agent's lookup, per record (a per-record agent's join): the worker's dict
        # itself, without a call to store() or to the store's own __getitem__.
        scope = current_scope()
        if scope is not None:
            try:
                return scope.stores[self].data[key]  # type: ignore[no-any-return]
            except KeyError:
                pass  # no such key (the default, or KeyError), or no store: the long way
        return self.store()[key]  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return key in self.store()

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default``."""
        return self.store().get(key, default)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[K]:
        return iter(self.store())

    def __len__(self) -> int:
        return len(self.store())

    def items(self) -> Iterator[tuple[K, V]]:
        """All (key, value) pairs."""
        return self.store().items()  # type: ignore[no-any-return]

    async def put(self, key: K, value: V | None) -> None:
        """Produce ``key -> value`` to the table's topic (None deletes); inside a worker."""
        await self.topic.send(value, key=key)


@functools.cache
def _window_options() -> tuple[str, ...]:
    """The options ``tumbling()`` and ``hopping()`` pass on to ``WindowedTable``."""
    own = inspect.signature(WindowedTable.__init__).parameters
    return tuple(p for p in own if p not in ("self", "name", "spec", "kwargs"))
