"""A plain-Python reference of a windowed table on one partition: what it emits, record by
record, for tumbling and hopping windows, late records dropped, far-future records refused.

No two phases, no hot window, no changelog: a dict of the values each (key, window) got,
a watermark, and the aggregations computed from the values themselves (not from flowkit's
accumulators), so a test can hold flowkit's results equal to it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

Window = tuple[int, int]  # (start, end) in ms


def aggregate(kind: str, values: list[tuple[int, int]], limit: int = 3) -> Any:
    """The result of aggregation ``kind`` over ``(event time, value)`` pairs in the order
    they were added."""
    vs = [v for _, v in values]
    if kind == "count":
        return len(vs)
    if kind == "sum":
        return sum(vs)
    if kind == "min":
        return min(vs)
    if kind == "max":
        return max(vs)
    if kind == "mean":
        return sum(vs) / len(vs)
    if kind == "last":
        latest = max(t for t, _ in values)
        return [v for t, v in values if t == latest][-1]  # of equal times, the last added
    if kind == "collect":
        return vs[:limit]
    if kind == "distinct":
        return len(set(vs))
    raise ValueError(kind)


@dataclass
class Reference:
    """One partition's windows: ``size``, ``step`` and ``grace`` in ms."""

    size: int
    step: int
    grace: int
    future_limit: int  # event times above it are refused (far-future records)
    max_ts: int | None = None
    values: dict[tuple[Any, Window], list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # Per (key, window): the values after each add, and the final one once closed.
    running: dict[tuple[Any, Window], list[list[tuple[int, int]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    closed: list[tuple[Any, Window]] = field(default_factory=list)

    @property
    def watermark(self) -> int | None:
        return None if self.max_ts is None else self.max_ts - self.grace

    def windows_of(self, ts: int) -> list[Window]:
        last = ts - ts % self.step
        return [
            (s, s + self.size) for s in range(last - self.size + self.step, last + 1, self.step)
        ]

    def add(self, key: Any, ts: int, value: int) -> None:
        if ts > self.future_limit:
            return  # refused: a far-future record moves nothing
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
            self._close()
        wm = self.watermark
        for w in self.windows_of(ts):
            if wm is not None and w[1] <= wm:
                continue  # late for this window: dropped
            self.values[key, w].append((ts, value))
            self.running[key, w].append(list(self.values[key, w]))

    def _close(self) -> None:
        wm = self.watermark
        assert wm is not None
        for key, w in sorted(self.values, key=lambda kw: (kw[1], repr(kw[0]))):
            if w[1] <= wm and (key, w) not in self.closed:
                self.closed.append((key, w))

    def finals(self, kind: str) -> dict[tuple[Any, Window], Any]:
        """The final result of every closed (key, window)."""
        return {kw: aggregate(kind, self.values[kw]) for kw in self.closed}

    def updates(self, kind: str, key: Any, w: Window) -> list[Any]:
        """The results (key, w) went through, one per add that changed its accumulator."""
        out: list[Any] = []
        previous: Any = None
        for values in self.running[key, w]:
            acc = _accumulator(kind, values)
            if acc != previous:
                out.append(aggregate(kind, values))
                previous = acc
        return out


def _accumulator(kind: str, values: list[tuple[int, int]]) -> Any:
    # What decides whether an add changed a window's value: the values the aggregation
    # keeps (a mean keeps sum and count; a count every add; last the latest record).
    vs = [v for _, v in values]
    if kind in ("count", "sum", "min", "max", "collect"):
        return (len(vs), aggregate(kind, values)) if kind == "count" else aggregate(kind, values)
    if kind == "mean":
        return (sum(vs), len(vs))
    if kind == "last":
        latest = max(t for t, _ in values)
        return (latest, aggregate(kind, values))
    if kind == "distinct":
        return frozenset(vs)
    raise ValueError(kind)
