"""Sliding tables: per-key aggregates over "the last ``size``", exact at every record.

The semantics are Kafka Streams' ``SlidingWindows``: windows ``[start, end]`` with
``end - start == size``, both bounds included, whose bounds the records set. For each
record at ``t`` there is the window ``[t - size, t]`` (the ``size`` up to it) and, when a
later record of the key follows within ``size``, the window ``[t + 1, t + 1 + size]``
(the ``size`` just after ``t`` has left it). Those are all the distinct sets of records
that a window of that size can hold, so an aggregate over the last ``size`` is exact at
every record, and each set is emitted once. A window closes when stream time minus
``grace`` passes its end; a record whose every window has closed (``t + size`` before
that) is late: dead-lettered, dropped or handed to ``late=``, as for any windowed table.

Like the other windowed tables, it runs in two phases, but what crosses the repartition
topic differs, and why is in ``sliding_source.py``: which windows exist depends on every
record of the key, so each source partition ships its records (in batches, at each
flush) and the partition that owns the key holds them for ``size + grace`` and computes
every window exactly (``sliding_owner.py``). A record costs the windows it enters: two
close times queued, and its value folded once into each window that holds it when that
window closes. The values of a window are combined with the table's ``combine`` (``+`` by
default) or a declared aggregation's ``merge``, in time order. With ``emit_on="update"``
the owner also emits, after each batch, every open window whose value its records changed
or that they made; ``add`` does nothing more for it.

Where flowkit differs from Kafka Streams: windows may start before time 0 (Kafka Streams
puts the records of the first ``size`` after the epoch in one window ``[0, size]``); the
values of a window are folded in time order, not arrival order (the same for any
commutative aggregation); and with several source partitions a record counts in every
window still open on the owning partition.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import DefinitionError
from ...scope import current_scope, require_scope
from ...windows import SlidingSpec, Window
from .sliding_store import SlidingStore
from .table import WindowedTable, _check_aggregate
from .windowset import WindowSet

__all__ = ["SlidingTable"]

K = TypeVar("K")
V = TypeVar("V")


class SlidingTable(WindowedTable[K, V]):
    """A table of per-key aggregates over sliding windows. Declare it with
    ``app.table(...).sliding(size, grace=...)``.

    >>> import flowkit
    >>> app = flowkit.App("shop", partitions=4)
    >>> spend = app.table("spend").sliding(60.0, grace=5.0, aggregate=flowkit.Sum("cents"))
    >>> spend.spec.kind, spend.spec.size_ms, spend.describe()["aggregate"]
    ('sliding', 60000, 'sum(cents)')
    """

    # Running updates need nothing of add: every record goes to its owner, which finds
    # the windows each one changed (sliding_owner.py).
    changed_entry = None

    def __init__(
        self,
        name: str,
        *,
        spec: SlidingSpec,
        aggregate: Any = None,
        emit_on: str = "close",
        on_update: Callable[..., Any] | None = None,
        combine: Callable[[V, V], V] = operator.add,
        **kwargs: Any,
    ) -> None:
        what = f"table {name!r}"
        if aggregate is not None:
            combine = _check_aggregate(what, aggregate, combine, spec, kwargs.get("partitions", 1))
        # The aggregation is applied here (each record lifted to a one-record accumulator,
        # merged on the owner), not through the tumbling tables' compiled add.
        super().__init__(
            name, spec=spec, combine=combine, emit_on=emit_on, on_update=on_update, **kwargs
        )
        self.aggregation = aggregate
        self.sliding_spec = spec
        self._lift: Callable[[Any, int], Any] | None = None
        if aggregate is not None:
            initial, fold = aggregate.initial, aggregate.add
            if aggregate.timed:
                self._lift = lambda amount, ts: fold(initial(), amount, ts)
            else:
                self._lift = lambda amount, ts: fold(initial(), amount)

    def new_store(self, now_ms: Callable[[], int]) -> SlidingStore:  # type: ignore[override]
        return SlidingStore(self, now_ms)

    def sliding_store(self) -> SlidingStore:
        """The store of the worker running the calling task."""
        store: SlidingStore = require_scope(f"table {self.name!r}").stores[self]
        return store

    def add(self, key: K, amount: V, ts: int | None = None) -> None:
        """Add a record of ``key`` at ``ts`` with ``amount``: it counts in every sliding
        window that holds ``ts``.

        ``ts`` is event time in milliseconds; without it the time comes from the record the
        agent is processing (the table's ``time`` function, else the record timestamp).
        """
        scope = current_scope()
        try:
            memo = scope.batch.memo  # type: ignore[union-attr]
        except AttributeError:
            memo = None
        if memo is None or memo[0] is not self:
            memo, ts = self._locate(scope, key, ts)
        elif ts is None:
            ts = self._time_of(scope)
        st: SlidingStore = memo[1]
        part = memo[2]
        if ts > part.max_ts:
            st.advance(part, ts)
        lifted = amount if self._lift is None else self._lift(amount, ts)
        if not st.add(part, key, ts, lifted):
            self._late(st, key, ts - self._size, amount)

    def __setitem__(self, key: K, value: V | WindowSet[K, V]) -> None:
        if type(value) is WindowSet and value.table is self and value.key == key:
            return  # the end of ``table[key] += n``: add() has already done it
        raise DefinitionError(
            f"sliding table {self.name!r}: table[key] = value would replace the value of "
            f"many windows; use {self.name}.add(key, amount) (or +=)"
        )

    # -- reads ----------------------------------------------------------------------------

    def value(self, key: K, ts: int) -> V | None:
        """``key``'s value over the ``size`` up to ``ts``, both ends included: the
        records known on this worker (see "Reads" in the windows documentation)."""
        found = self.sliding_store().latest(key, ts)
        if found is not None and self.aggregation is not None:
            return self.aggregation.finish(found)  # type: ignore[no-any-return]
        return found  # type: ignore[no-any-return]

    def windows(self, key: K) -> dict[Window, V]:
        """Every window ``key``'s records known on this worker define, open and closed
        (until their records expire)."""
        found = self.sliding_store().windows(key)
        if self.aggregation is not None:
            finish = self.aggregation.finish
            return {w: finish(v) for w, v in found.items()}
        return found
