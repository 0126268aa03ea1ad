"""The figures the live page puts on the graph, as one JSON document (``GET /status``).

Counts are totals since the worker started; the page turns them into rates by comparing
two polls. Everything here is read from state the worker holds anyway, when asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..state import WindowedStore, WindowedTable
from ..state.windowed.stage1 import NONE
from .observe import partition_lag

if TYPE_CHECKING:
    from prometheus_client import Counter

    from .worker import Worker

__all__ = ["status"]


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
        "topics": topics,
        "tables": _tables(worker),
        "recovery": {
            "active": recovery.active,
            "left": recovery.left,
            "done": recovery.done,
            "rate": round(recovery.rate(), 1),
        },
    }


def _tables(worker: Worker) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for table in worker.app.tables.values():
        store = worker.state.stores[table]
        if isinstance(table, WindowedTable) and isinstance(store, WindowedStore):
            parts = store.parts.values()
            marks = [part.wm for part in parts if part.wm != NONE]
            out[table.name] = {
                "keys": sum(len(w) for part in parts for w in part.partials.values()),
                "watermark": min(marks) if marks else None,
                "closed_windows": store.closed_windows,
            }
        else:
            out[table.name] = {"keys": len(store)}
    return out


def _by_labels(counter: Counter) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[tuple(sample.labels.values())] = sample.value
    return out
