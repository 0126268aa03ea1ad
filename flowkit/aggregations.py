"""Aggregations a windowed table can be declared with, instead of the agent writing its slots.

An aggregation is ``(initial, add, merge)``, as in Kafka Streams' ``aggregate``: ``initial()``
makes a key's empty accumulator in a window, ``add(acc, value)`` folds one value in (on the
source partition, per record), and ``merge(a, b)`` combines two accumulators (on the partition
that owns the key, one per source partition; session windows merge sessions too). An
optional ``result(acc)`` turns the accumulator into what is emitted and read (a mean from a
sum and a count). Accumulators travel as JSON, so they are numbers, strings, lists or None.

>>> m = Mean("ms")
>>> class R:
...     ms = 4
>>> acc = m.add(m.add(m.initial(), R()), R())
>>> m.result(m.merge(acc, [2, 1]))
3.3333333333333335
>>> Sum("price").name, Count().name
('sum(price)', 'count')
"""

from __future__ import annotations

import builtins
import hashlib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from . import arguments
from .errors import DefinitionError

__all__ = [
    "Aggregation",
    "Collect",
    "Count",
    "DistinctCount",
    "Last",
    "Max",
    "Mean",
    "Min",
    "Sum",
]

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Aggregation:
    """A user-defined aggregation: ``initial()``, ``add(acc, value)``, ``merge(acc, acc)``,
    and optionally ``result(acc)``.

    ``merge`` must be associative and commutative, and agree with ``add``: merging the
    accumulators of two parts of the records gives what adding them all would. It may be
    left out (None) only where nothing is merged: a table of one partition with tumbling or
    hopping windows; elsewhere the declaration stops with one line.

    >>> sizes = Aggregation(initial=list, add=lambda acc, v: acc + [v], merge=operator.add)
    >>> sizes.merge(sizes.add(sizes.initial(), 1), [2])
    [1, 2]
    """

    initial: Callable[[], Any]
    add: Callable[..., Any]
    merge: Callable[[Any, Any], Any] | None = None
    result: Callable[[Any], Any] | None = None
    name: str = "aggregation"
    # For the built-ins that are a merge of one value taken from each record (count, sum,
    # min, max): that value as an expression of ``amount`` (the value given to ``add``),
    # which the table inlines into its per-record add, so a declared count costs what a
    # hand-written ``add(key, 1)`` does. None with ``lifted``: the amount itself.
    lift: str | None = None
    lifted: bool = False
    # True when ``add`` takes the record's event time too: ``add(acc, value, ts)``.
    timed: bool = False

    def __post_init__(self) -> None:
        what = f"aggregation {self.name!r}"
        arguments.function(self.initial, f"{what}: initial")
        arguments.function(self.add, f"{what}: add")
        for option in ("merge", "result"):
            fn = getattr(self, option)
            if fn is not None:
                arguments.function(fn, f"{what}: {option}")

    def __str__(self) -> str:
        return self.name

    def finish(self, acc: Any) -> Any:
        """What is emitted and read for the accumulator ``acc``."""
        return acc if self.result is None else self.result(acc)


def _field(field: str | None, what: str) -> str | None:
    if field is None:
        return None
    if not isinstance(field, str) or not _FIELD.match(field):
        raise DefinitionError(
            f"{what}: field must be a field name such as 'amount' or 'order.total', "
            f"not {arguments.shown(field)}"
        )
    return field


def _getter(field: str | None) -> Callable[[Any], Any]:
    if field is None:
        return lambda value: value
    return operator.attrgetter(field)


def _named(kind: str, field: str | None) -> str:
    return f"{kind}({field or ''})"


def Count() -> Aggregation:
    """The number of records added: ``table.add(key, record)`` counts one, whatever the
    record. ``table[key] += 1`` counts one too."""
    return Aggregation(
        initial=int,
        add=lambda acc, value: acc + 1,
        merge=operator.add,
        name="count",
        lift="1",
        lifted=True,
    )


def _lifted(kind: str, field: str | None, merge: Callable[[Any, Any], Any]) -> Aggregation:
    field = _field(field, kind)
    get = _getter(field)

    def add(acc: Any, value: Any) -> Any:
        v = get(value)
        return v if acc is None else merge(acc, v)

    return Aggregation(
        initial=lambda: None,
        add=add,
        merge=merge,
        name=_named(kind, field),
        lift=None if field is None else f"amount.{field}",
        lifted=True,
    )


def Sum(field: str | None = None) -> Aggregation:
    """The sum of ``field`` of the records added (of the values themselves, without one)."""
    return _lifted("sum", field, operator.add)


def Min(field: str | None = None) -> Aggregation:
    """The smallest ``field`` (or value) added."""
    return _lifted("min", field, builtins.min)


def Max(field: str | None = None) -> Aggregation:
    """The largest ``field`` (or value) added."""
    return _lifted("max", field, builtins.max)


def Mean(field: str | None = None) -> Aggregation:
    """The mean of ``field`` (or of the values): a ``[sum, count]`` accumulator, emitted as
    ``sum / count``."""
    field = _field(field, "mean")
    get = _getter(field)

    def add(acc: list[Any], value: Any) -> list[Any]:
        return [acc[0] + get(value), acc[1] + 1]

    return Aggregation(
        initial=lambda: [0, 0],
        add=add,
        merge=lambda a, b: [a[0] + b[0], a[1] + b[1]],
        result=lambda acc: acc[0] / acc[1] if acc[1] else None,
        name=_named("mean", field),
    )


def Last(field: str | None = None) -> Aggregation:
    """``field`` (or the value) of the record with the latest event time: a ``[time,
    value]`` accumulator. Of records with the same event time, the one added last on its
    partition; across partitions, the one of the higher partition."""
    field = _field(field, "last")
    get = _getter(field)

    def add(acc: list[Any] | None, value: Any, ts: int) -> list[Any]:
        if acc is None or ts >= acc[0]:
            return [ts, get(value)]
        return acc

    def merge(a: list[Any] | None, b: list[Any] | None) -> list[Any] | None:
        if a is None or (b is not None and b[0] >= a[0]):
            return b
        return a

    return Aggregation(
        initial=lambda: None,
        add=add,
        merge=merge,
        result=lambda acc: None if acc is None else acc[1],
        name=_named("last", field),
        timed=True,
    )


def Collect(field: str | None = None, *, limit: int = 100) -> Aggregation:
    """A list of ``field`` (or the values) added, at most ``limit`` long: the first
    ``limit`` a partition adds, partitions in order of their number."""
    field = _field(field, "collect")
    arguments.count(limit, "Collect(): limit")
    get = _getter(field)

    def add(acc: list[Any], value: Any) -> list[Any]:
        if len(acc) < limit:
            acc.append(get(value))  # the accumulator is this window's own: no copy
        return acc

    return Aggregation(
        initial=list,
        add=add,
        merge=lambda a, b: (a + b)[:limit],
        result=list,  # a copy: a read does not hand out the window's own list
        name=_named("collect", field) if limit == 100 else f"collect({field or ''}, {limit})",
    )


_encode = msgspec.json.Encoder().encode


def DistinctCount(field: str | None = None, *, precision: int = 8) -> Aggregation:
    """About how many distinct ``field`` values (or values) were added: exact up to
    ``2 ** precision // 4`` of them (64 at the default 8: their 64-bit hashes are kept),
    then a HyperLogLog sketch of ``2 ** precision`` registers (``precision`` from 4 to 16)
    whose standard error is ``1.04 / sqrt(2 ** precision)``: 6.5 % at 8. Values are told
    apart by their JSON encoding."""
    field = _field(field, "distinct")
    if not isinstance(precision, int) or isinstance(precision, bool) or not 4 <= precision <= 16:
        raise DefinitionError(
            f"DistinctCount(): precision must be an int from 4 to 16, not "
            f"{arguments.shown(precision)}"
        )
    get = _getter(field)
    m = 1 << precision
    mask = m - 1
    width = 64 - precision
    exact = m // 4  # below it the accumulator is the list of hashes (shorter than m)

    def hashed(value: Any) -> int:
        digest = hashlib.blake2b(_encode(get(value)), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    def registers(hashes: list[int]) -> list[int]:
        regs = [0] * m
        for h in hashes:
            _set(regs, h)
        return regs

    def _set(regs: list[int], h: int) -> None:
        i = h & mask
        rank = width - (h >> precision).bit_length() + 1
        if rank > regs[i]:
            regs[i] = rank

    def add(acc: list[int], value: Any) -> list[int]:
        h = hashed(value)
        # The accumulator is this window's own: changed in place, no copy.
        if len(acc) == m:
            _set(acc, h)
        elif h not in acc:
            acc.append(h)
            if len(acc) > exact:
                return registers(acc)
        return acc

    def merge(a: list[int], b: list[int]) -> list[int]:
        if len(a) < m and len(b) < m:
            seen = set(a)
            union = a + [h for h in b if h not in seen]
            return union if len(union) <= exact else registers(union)
        regs_a = a if len(a) == m else registers(a)
        regs_b = b if len(b) == m else registers(b)
        return list(map(builtins.max, regs_a, regs_b))

    def result(acc: list[int]) -> int:
        if len(acc) < m:
            return len(acc)
        alpha = 0.7213 / (1 + 1.079 / m) if m >= 128 else {16: 0.673, 32: 0.697, 64: 0.709}[m]
        estimate = alpha * m * m / math.fsum(2.0**-r for r in acc)
        zeros = acc.count(0)
        if estimate <= 2.5 * m and zeros:
            estimate = m * math.log(m / zeros)  # linear counting: small sets
        return round(estimate)

    return Aggregation(
        initial=list,
        add=add,
        merge=merge,
        result=result,
        name=_named("distinct", field),
    )
