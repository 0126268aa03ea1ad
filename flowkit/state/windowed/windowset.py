"""``table[key]`` on a windowed table: the key's windows, read relative to a time.

As in Faust, ``counts[key]`` is a ``WindowSet``, not a number: ``.current()`` is the value
in the window of the record being processed, ``.now()`` in the window of the wall clock,
``.delta(seconds)`` that long before the record, ``.value(ts)`` at an explicit time. And
``counts[key] += n`` works: ``+=`` is ``counts.add(key, n)`` (every window that contains
the record), then Python assigns the set back, which the table ignores.

Building a ``WindowSet`` is one small allocation and no lookup: the time and the worker's
state are found only when it is read, so ``counts[key] += 1`` costs about what
``counts.add(key, 1)`` does.
"""

from __future__ import annotations

import operator
from datetime import datetime
from typing import TYPE_CHECKING, Generic, TypeVar

from ...durations import Seconds, seconds
from ...errors import DefinitionError
from ...scope import require_scope
from ...windows import Window

if TYPE_CHECKING:
    from .table import WindowedTable

__all__ = ["WindowSet"]

K = TypeVar("K")
V = TypeVar("V")


class WindowSet(Generic[K, V]):
    """One key of a windowed table, across its windows (``table[key]``).

    Reads return the table's ``default()`` (``0`` for ``default=int``) when the window
    has no value for the key, else None. What a read includes depends on where it runs:
    see "Reads" in the windows documentation.
    """

    __slots__ = ("key", "table")

    def __init__(self, table: WindowedTable[K, V], key: K) -> None:
        self.table = table
        self.key = key

    def __repr__(self) -> str:
        return f"<WindowSet {self.table.name}[{self.key!r}]>"

    # -- updates --------------------------------------------------------------------------

    def __iadd__(self, amount: V) -> WindowSet[K, V]:
        self._check_sum("+=")
        self.table.add(self.key, amount)
        return self

    def __isub__(self, amount: V) -> WindowSet[K, V]:
        self._check_sum("-=")
        self.table.add(self.key, -amount)  # type: ignore[operator]
        return self

    def _check_sum(self, op: str) -> None:
        aggregation = self.table.aggregation
        if aggregation is not None and aggregation.name not in ("count", "sum()"):
            name = self.table.name
            raise DefinitionError(
                f"table {name!r} aggregates with {aggregation}: {name}[key] {op} n would "
                f"add n itself; use {name}.add(key, value)"
            )
        if self.table.combine is not operator.add:
            name = self.table.name
            raise DefinitionError(
                f"table {name!r} combines with {getattr(self.table.combine, '__name__', '?')}, "
                f"not +: {name}[key] {op} n would add; use {name}.add(key, value)"
            )

    # -- reads ----------------------------------------------------------------------------

    def current(self) -> V | None:
        """The value in the window of the record being processed (inside an agent)."""
        return self._at(self.table.record_time("current()"))

    def now(self) -> V | None:
        """The value in the window that contains the worker's wall clock now."""
        return self._at(require_scope(f"table {self.table.name!r}: now()").now_ms())

    def delta(self, before: Seconds) -> V | None:
        """The value in the window ``before`` seconds (or a ``timedelta``) earlier than
        the record being processed."""
        ms = round(seconds(before, "delta()") * 1000)
        return self._at(self.table.record_time("delta()") - ms)

    def value(self, ts: int | datetime | None = None) -> V | None:
        """The value in the window that contains ``ts``: event time in ms, or an aware
        ``datetime``; without it, the record being processed (as ``current()``)."""
        if ts is None:
            return self.current()
        if isinstance(ts, datetime):
            if ts.tzinfo is None:
                raise DefinitionError("value(ts=): a datetime needs a timezone (tzinfo)")
            ts = round(ts.timestamp() * 1000)
        return self._at(ts)

    def windows(self) -> dict[Window, V]:
        """Every window this worker knows for the key (``table.windows(key)``)."""
        return self.table.windows(self.key)

    def _at(self, ts: int) -> V | None:
        found = self.table.value(self.key, ts)
        if found is None and self.table.default is not None:
            return self.table.default()
        return found
