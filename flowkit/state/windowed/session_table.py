"""Session tables: per-key aggregates over sessions of activity, in two phases.

A key's records closer than ``gap`` in event time form one session; a record that bridges
two sessions merges them, their values joined with the table's ``combine`` (required:
there is no safe default for merging two values), or the ``merge`` of its declared
aggregation (``aggregate=``; each record becomes an accumulator of its own first). The
semantics are Kafka Streams'
``SessionWindows``: a session is ``[start, end]``, the times of its first and last record;
on its partition it closes when stream time passes ``end + gap + grace``, and a record
whose session would end before ``stream time - grace - gap`` is late (dead-lettered,
dropped or handed to ``late=``, as for any windowed table).

As tumbling tables do, a session table aggregates where the records are (each source
partition keeps its own sessions) and combines on the partition that owns the key: a
source sends a session when it closes there, and the owner merges the sessions of every
source within ``gap`` of each other, closing a merged session once every source's
watermark has passed it. Each closed session goes once to ``on_close`` and ``to=``, with
its final bounds. With ``emit_on="update"``, sources also send their open sessions that
changed at every flush, and the owner emits each session as it stands (``on_update``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

from ...aggregations import Aggregation
from ...errors import DefinitionError
from ...scope import current_scope, require_scope
from ...windows import SessionSpec, Window
from .session_store import SessionStore
from .table import WindowedTable
from .windowset import WindowSet

__all__ = ["SessionTable"]

K = TypeVar("K")
V = TypeVar("V")


class SessionTable(WindowedTable[K, V]):
    """A table of per-key aggregates over sessions. Declare it with
    ``app.table(...).session(gap, combine=...)``.

    >>> import operator, flowkit
    >>> app = flowkit.App("shop", partitions=4)
    >>> visits = app.table("visits", default=int).session(1800.0, combine=operator.add)
    >>> visits.spec.kind, visits.spec.gap_ms
    ('session', 1800000)
    """

    # A running update notes the key: its open sessions go to their owner (_adds.py).
    changed_entry = "key"

    def __init__(
        self,
        name: str,
        *,
        spec: SessionSpec,
        combine: Callable[[V, V], V] | None = None,
        aggregate: Aggregation | None = None,
        **kwargs: Any,
    ) -> None:
        if combine is None:
            if aggregate is None:
                raise DefinitionError(
                    f"table {name!r}: session windows merge sessions, so session() needs "
                    "combine=, a function of two values (operator.add for counts and sums), "
                    "or aggregate= (flowkit.Count() and others)"
                )
            combine = operator.add  # the default: the aggregation's merge replaces it
        super().__init__(name, spec=spec, combine=combine, aggregate=aggregate, **kwargs)
        self.session_spec = spec

    def new_store(self, now_ms: Callable[[], int]) -> SessionStore:  # type: ignore[override]
        return SessionStore(self, now_ms)

    def sessions(self) -> SessionStore:
        """The store of the worker running the calling task."""
        store: SessionStore = require_scope(f"table {self.name!r}").stores[self]
        return store

    def add(self, key: K, amount: V, ts: int | None = None) -> None:
        """Put ``amount`` into ``key``'s session at ``ts``, merging sessions it bridges.

        ``ts`` is event time in milliseconds; without it the time comes from the record the
        agent is processing (the table's ``time`` function, else the record timestamp).
        With ``aggregate=``, ``amount`` is the record the aggregation reads.
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
        # (here a declared aggregation's lift of amount, in its specialised add: _adds.py)
        # (here a declared aggregation's accumulator of one record, specialised: _adds.py)
        st: SessionStore = memo[1]
        part = memo[2]
        if ts > part.max_ts:
            st.advance(part, ts)
        if not st.add(part, key, ts, amount):
            self._late(st, key, ts, amount)
            return
        # (here running updates mark the key changed, in a specialised add: _adds.py)

    def __setitem__(self, key: K, value: V | WindowSet[K, V]) -> None:
        if type(value) is WindowSet and value.table is self and value.key == key:
            return  # the end of ``table[key] += n``: add() has already done it
        raise DefinitionError(
            f"session table {self.name!r}: table[key] = value would replace a session's "
            f"value; use {self.name}.add(key, amount) (or +=), which merges with combine"
        )

    # -- reads ----------------------------------------------------------------------------

    def value(self, key: K, ts: int) -> V | None:
        """The value of ``key``'s latest session that starts at or before ``ts``: final
        once closed (until it expires); while open, the parts known on this worker."""
        return self.sessions().latest(key, ts)  # type: ignore[no-any-return]

    def windows(self, key: K) -> dict[Window, V]:
        """Every session this worker knows for ``key``, open and closed (until expiry)."""
        return self.sessions().windows(key)
