"""The figures the live page puts on the graph, as one JSON document (``GET /status``).

Counts are totals since the worker started; the page turns them into rates by comparing
two polls, and keeps the last minutes of them for its sparklines. Per agent, ``latency``
is its end-to-end latency histogram (``flowkit_e2e_latency_seconds``) as cumulative bucket
counts, ``[[upper bound, count], ...]``, with ``p50``/``p99`` estimated from them since the
worker started. ``letters`` are the latest dead letters this worker sent (newest first).
Everything here is read from state the worker holds anyway, when asked.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from ...state import SessionStore, SlidingStore, WindowedStore, WindowedTable
from ...state.windowed.stage1 import NONE
from ..observe.collector import partition_lag

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

    from ..letters.sending import RecentLetter
    from ..worker import Worker

__all__ = ["quantile", "status"]


def status(worker: Worker) -> dict[str, Any]:
    """The worker's figures: per agent, topic and table, plus the totals."""
    dispatcher = worker.dispatcher
    agents: dict[str, dict[str, float]] = {a.name: {"records": 0} for a in worker.app.agents}
    if dispatcher is not None:
        for agent, source in dispatcher.sources:
            agents[agent.name]["records"] += source.records
        for name, count in dispatcher.outputs.items():
            agents[name]["outputs"] = count
    for (agent_name, _stage), value in _by_labels(worker.metrics.errors).items():
        if agent_name in agents:
            agents[agent_name]["errors"] = agents[agent_name].get("errors", 0) + value
    letters: list[dict[str, Any]] = []
    if dispatcher is not None:
        for owner, count in dispatcher.letters.by_agent.items():
            if owner is not None and owner in agents:
                agents[owner]["dead_letters"] = count
        letters = [_letter(letter) for letter in reversed(dispatcher.letters.recent)]
    latency: dict[str, dict[str, Any]] = {}
    for name, buckets in _buckets(worker.metrics.e2e_latency).items():
        if name in agents:
            latency[name] = {
                # JSON has no infinity: the last bound is written as Prometheus writes it
                "buckets": [[b if b != math.inf else "+Inf", c] for b, c in buckets],
                "p50": quantile(buckets, 0.5),
                "p99": quantile(buckets, 0.99),
            }
    topics: dict[str, dict[str, float]] = {}
    for topic, _partition, records, seconds in partition_lag(worker):
        entry = topics.setdefault(topic, {"lag": 0, "lag_seconds": 0.0, "partitions": 0})
        entry["lag"] += records
        entry["lag_seconds"] = max(entry["lag_seconds"], seconds)
        entry["partitions"] += 1
    dead_letters = sum(_by_labels(worker.metrics.dead_letters).values())
    recovery = worker.state.recovery
    return {
        "app": worker.app.name,
        "alive": worker.error is None,
        "ready": worker.ready,
        "elapsed": round(worker.elapsed, 3),
        "records_in": worker.records_in,
        "dead_letters": dead_letters,
        "agents": agents,
        "latency": latency,
        "letters": letters,
        "topics": topics,
        "tables": _tables(worker),
        "recovery": {
            "active": recovery.active,
            "left": recovery.left,
            "done": recovery.done,
            "rate": round(recovery.rate(), 1),
            "from_local": recovery.from_local,
            "from_standby": recovery.from_standby,
        },
        "standby": {
            "partitions": worker.state.standbys.partitions(),
            "lag": worker.state.standbys.lag(),
        },
    }


def _tables(worker: Worker) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for table in worker.app.tables.values():
        store = worker.state.stores[table]
        if isinstance(table, WindowedTable) and isinstance(store, WindowedStore | SessionStore):
            parts = store.parts.values()
            marks = [part.wm for part in parts if part.wm != NONE]
            out[table.name] = {
                "keys": sum(len(w) for part in parts for w in part.partials.values()),
                "watermark": min(marks) if marks else None,
                "closed_windows": store.closed_windows,
            }
        elif isinstance(table, WindowedTable) and isinstance(store, SlidingStore):
            marks = [part.wm for part in store.parts.values() if part.wm != NONE]
            out[table.name] = {
                "keys": sum(store.keys_held(p) for p in store.parts),
                "watermark": min(marks) if marks else None,
                "closed_windows": store.closed_windows,
            }
        elif hasattr(store, "__len__"):
            out[table.name] = {"keys": len(store)}
        else:  # a join's buffers: records, not keys
            out[table.name] = {}
    return out


def _by_labels(counter: Counter) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[tuple(sample.labels.values())] = sample.value
    return out


def quantile(buckets: list[list[float]], q: float) -> float | None:
    """The ``q`` quantile of a histogram's cumulative ``[[upper bound, count], ...]``, as
    Prometheus' ``histogram_quantile`` estimates it: linear within the bucket it falls in
    (the last finite bound when it falls in the ``+Inf`` one). None with no observations.

    >>> quantile([[0.1, 0], [0.5, 10], [1.0, 10], [math.inf, 10]], 0.5)
    0.3
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return round(lower + (bound - lower) * (rank - below) / (count - below), 6)
        lower, below = bound, count
    return lower


def _buckets(histogram: Histogram) -> dict[str, list[list[float]]]:
    """Per agent label, the cumulative bucket counts, in bound order."""
    out: dict[str, list[list[float]]] = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                labels = dict(sample.labels)
                bound = float(labels.pop("le"))
                out.setdefault(next(iter(labels.values()), ""), []).append([bound, sample.value])
    for buckets in out.values():
        buckets.sort()
    return out


# The innermost frame of a short traceback: where the record failed.
_FRAME = re.compile(r'File "([^"]*)", line (\d+), in (\S+)')


def _letter(letter: RecentLetter) -> dict[str, Any]:
    (kind, message, traceback), stage, agent, topic, partition, offset, failed_at, dlq = letter
    frames = _FRAME.findall(traceback.decode("utf-8", "replace"))
    location = f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else None
    return {
        "error": kind.decode("utf-8", "replace"),
        "message": message.decode("utf-8", "replace"),
        "location": location,
        "stage": stage,
        "agent": agent,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "failed_at_ms": failed_at,
        "dead_letter_topic": dlq,
    }
