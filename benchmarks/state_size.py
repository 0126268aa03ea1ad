"""State size: what a table costs in memory per key, beyond its keys and values.

    python -m benchmarks.state_size [--keys 1000000]

A table of ``--keys`` small keys (``user-0000042`` -> an int), held by a worker on the
memory broker, measured with ``tracemalloc`` in two ways:

* recovered: a worker rebuilds the table from its changelog;
* written: a worker's agent writes every key once (``table[user] = n``) from a topic,
  and commits (so the changes waiting for the changelog are drained).

For each, the memory the worker holds once done, minus the same worker's with no keys
(its fixed cost), divided by the keys, minus the bytes of the key and value objects
themselves (``sys.getsizeof``) is the table's own cost per key: dict slots and whatever
else flowkit keeps per key. The broker's copy of the records (the changelog and the input
topic, which stand for Kafka) is allocated before tracing starts, filtered out, or (the
changelog's key and value bytes) subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc
from typing import Any

import flowkit
from benchmarks.recovery import make_app, memory_broker
from flowkit.logs import configure_logging
from flowkit.transports import MemoryBroker, MemoryTransport

# Allocations by the embedded broker (records appended while the worker runs: the
# changelog it writes) are the broker's, not the table's.
_NOT_STATE = [tracemalloc.Filter(False, "*/flowkit/transports/memory/*")]


class Update(flowkit.Record):
    user: str
    n: int


def writer_app() -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("state-bench", partitions=4)
    updates = app.topic("state-bench-updates", value_type=Update)
    users = app.table("users", default=int, value_type=int)

    @app.agent(updates)
    async def write(stream: flowkit.Stream[Update]) -> None:
        async for u in stream:
            users[u.user] = u.n

    return app, updates, users


def _traced() -> int:
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(_NOT_STATE)
    return sum(stat.size for stat in snapshot.statistics("filename"))


def _changelog_bytes(broker: MemoryBroker, table: Any) -> int:
    """The key and value bytes the broker holds in the changelog the worker wrote: encoded
    by the table's codecs, so traced there, but the broker's (they stand for Kafka's)."""
    return sum(
        sys.getsizeof(m.key) + sys.getsizeof(m.value)
        for p in range(table.partitions)
        for m in broker.messages(table.changelog_topic, p)
    )


def _objects_size(store: Any) -> int:
    return sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in store.items())


async def recovered(n: int) -> tuple[int, int, int]:
    """(traced bytes held while running, bytes of keys and values, keys)."""
    app, table = make_app()
    broker = memory_broker(table, n)
    gc.collect()
    tracemalloc.start()
    worker = flowkit.Worker(app, transport=MemoryTransport(broker), status_interval=None)
    try:
        async with worker:
            store = worker.state.stores[table]
            while worker.state.recovery.done < n or worker.state.recovery.active:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            held = _traced()
            return held, _objects_size(store), len(store)
    finally:
        tracemalloc.stop()


async def written(n: int) -> tuple[int, int, int]:
    app, updates, table = writer_app()
    broker = MemoryBroker(retention_records=None)
    producer = MemoryTransport(broker).producer()
    broker.create_topic(updates.name, 4)
    encode = updates.encode
    for i in range(n):
        user = f"user-{i:07d}"
        await producer.send(updates.name, encode(Update(user, i + 1000)), key=user.encode())
    gc.collect()
    tracemalloc.start()
    worker = flowkit.Worker(
        app, transport=MemoryTransport(broker), commit_interval=0.1, status_interval=None
    )
    try:
        async with worker:
            store = worker.state.stores[table]
            while worker.records_in < n or not worker.is_idle():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # a checkpoint drains what waits for the changelog
            held = _traced() - _changelog_bytes(broker, table)
            return held, _objects_size(store), len(store)
    finally:
        tracemalloc.stop()


def measure(name: str, run: Any, n: int) -> float:
    start = time.perf_counter()
    base, _, _ = asyncio.run(run(0))
    held, objects, keys = asyncio.run(run(n))
    if keys != n:
        raise SystemExit(f"{name}: the table holds {keys:,} keys, expected {n:,}")
    per_key = (held - base) / n
    own = per_key - objects / n
    print(
        f"{name:<10}: {per_key:6.0f} B a key held, of which keys and values {objects / n:4.0f} B;"
        f" the table's own cost {own:4.0f} B a key   ({time.perf_counter() - start:.0f} s)"
    )
    return own


def main() -> None:
    parser = argparse.ArgumentParser(description="bytes per key of a table, beyond keys/values")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--only", choices=["recovered", "written"], help="one of the two")
    args = parser.parse_args()
    configure_logging("warning")
    print(f"a table of {args.keys:,} keys like 'user-0000042' -> int, 4 partitions (tracemalloc)")
    if args.only != "written":
        measure("recovered", recovered, args.keys)
    if args.only != "recovered":
        measure("written", written, args.keys)


if __name__ == "__main__":
    main()
