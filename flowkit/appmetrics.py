"""The app's own metrics: declared on the App, created on each worker's registry.

``app.metrics.counter("orders_rejected", "Orders we refused", ["reason"])`` declares a
metric the way ``app.table`` declares a table: nothing is registered yet. Each worker that
runs the app creates it on its own Prometheus registry (so two workers of one app in one
process count separately), and a task of that worker reaches its copy through its scope:

>>> import flowkit
>>> app = flowkit.App("shop")
>>> rejected = app.metrics.counter("orders_rejected", "Orders we refused", ["reason"])
>>> @app.agent(app.topic("orders"))
... async def check(stream):
...     async for order in stream:
...         rejected.labels("no stock").inc()

Served on ``/metrics`` with the worker's own metrics, under ``flowkit worker`` too. A
label lookup costs a dict lookup: in a hot loop, count in a local and ``inc(n)`` once per
batch (``async for batch in stream.batches()``) rather than once per record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from . import arguments
from .errors import DefinitionError
from .scope import require_scope

__all__ = ["AppMetric", "AppMetrics"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KINDS: dict[str, Any] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


class AppMetric:
    """One declared metric. Its methods act on the running worker's copy: ``inc``,
    ``dec``, ``set`` and ``observe`` as in prometheus-client, and ``labels(...)`` for the
    child of a labelled metric."""

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float] | None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labels)
        self.buckets = tuple(buckets) if buckets is not None else None

    def __repr__(self) -> str:
        return f"<AppMetric {self.kind} {self.name!r}>"

    def create(self, registry: CollectorRegistry) -> Any:
        """This metric on ``registry`` (a worker calls it once when it starts)."""
        kwargs: dict[str, Any] = {"registry": registry}
        if self.buckets is not None:
            kwargs["buckets"] = self.buckets
        if self.kind == "gauge":  # under --processes N: one series per running process
            kwargs["multiprocess_mode"] = "liveall"
        return _KINDS[self.kind](self.name, self.documentation, self.labelnames, **kwargs)

    def current(self) -> Any:
        """The running worker's copy of this metric (a prometheus-client object)."""
        return require_scope(f"metric {self.name!r}").stores[self]

    def labels(self, *values: str, **named: str) -> Any:
        """The child for these label values, on the running worker's copy."""
        return self.current().labels(*values, **named)

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (counters and gauges)."""
        self.current().inc(amount)

    def dec(self, amount: float = 1) -> None:
        """Subtract ``amount`` (gauges)."""
        self.current().dec(amount)

    def set(self, value: float) -> None:
        """Set the value (gauges)."""
        self.current().set(value)

    def observe(self, value: float) -> None:
        """Record one observation (histograms)."""
        self.current().observe(value)


class AppMetrics:
    """The metrics an App declares (``app.metrics``)."""

    def __init__(self, check_open: Callable[[], None]) -> None:
        self._check_open = check_open
        self.declared: dict[str, AppMetric] = {}

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> AppMetric:
        """Declare a counter (exposed as ``<name>_total``)."""
        return self._declare("counter", name, documentation, labels, None)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> AppMetric:
        """Declare a gauge."""
        return self._declare("gauge", name, documentation, labels, None)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] | None = None,
    ) -> AppMetric:
        """Declare a histogram (prometheus-client's default buckets unless given)."""
        return self._declare("histogram", name, documentation, labels, buckets)

    def _declare(
        self,
        kind: str,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float] | None,
    ) -> AppMetric:
        self._check_open()
        if not isinstance(name, str):
            raise DefinitionError(f"metric name must be a str, not {arguments.shown(name)}")
        if not _NAME.match(name):
            raise DefinitionError(f"metric name {name!r} is not a Prometheus metric name")
        if name.startswith("flowkit_"):
            raise DefinitionError(f"metric name {name!r}: the flowkit_ prefix is flowkit's own")
        if name in self.declared:
            raise DefinitionError(f"metric {name!r} is declared twice")
        _check_parts(name, documentation, labels, buckets)
        metric = self.declared[name] = AppMetric(kind, name, documentation, labels, buckets)
        return metric


def _check_parts(name: str, documentation: object, labels: object, buckets: object) -> None:
    # What prometheus-client would refuse only when a worker creates the metric.
    what = f"metric {name!r}"
    arguments.text(documentation, f"{what}: documentation")
    if isinstance(labels, str | bytes) or not isinstance(labels, Sequence):
        raise DefinitionError(
            f"{what}: labels must be a list of str, not {arguments.shown(labels)}"
        )
    for label in labels:
        if not (isinstance(label, str) and _LABEL.match(label)) or label.startswith("__"):
            raise DefinitionError(f"{what}: label {label!r} is not a Prometheus label name")
    if buckets is None:
        return
    numbers = isinstance(buckets, Sequence) and not isinstance(buckets, str | bytes)
    if not numbers or not all(
        isinstance(b, int | float) and not isinstance(b, bool)
        for b in buckets  # type: ignore[attr-defined]
    ):
        raise DefinitionError(
            f"{what}: buckets must be a list of numbers, not {arguments.shown(buckets)}"
        )
    if list(buckets) != sorted(buckets):  # type: ignore[call-overload]
        raise DefinitionError(f"{what}: buckets must be in increasing order")
