"""Key expiry: a counting table with ttl= against the same table without, in instructions.

    python -m benchmarks.ttl_count --instructions --records 50000   # callgrind
    python -m benchmarks.ttl_count --records 200000                  # seconds, one round each

The records (keyed by one of 5,000 keys, on 4 partitions, event times 1 ms apart) are
loaded into the memory broker, then counted by ``counts[key] += 1`` in a worker until
every record is processed:

* hand-written: the same count into a dict, over the broker's logs;
* flowkit: a table without ``ttl`` (the baseline of the other two);
* ttl: the same table with ``ttl=3600`` on event time (no key expires);
* ttl, expiring: ``ttl=2``: every key expires and is written again many times.

The worker checkpoints once, when it stops (``commit_interval`` of an hour), so the
instruction counts are deterministic: the difference between the forms is the cost of
stamping writes with their record's time and of the final drain and sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

import flowkit
from benchmarks.callgrind import compare
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.transports import MemoryBroker, MemoryTransport

PARTITIONS = 4
KEYS = 5_000
START = 1_700_000_000_000
TTLS = {"flowkit": None, "ttl": 3600.0, "expiring": 2.0}


async def loaded_broker(n: int) -> MemoryBroker:
    """``n`` records keyed by one of ``KEYS`` keys, placed as a Kafka producer would."""
    broker = MemoryBroker(retention_records=None)
    broker.create_topic("keys", PARTITIONS)
    producer = MemoryTransport(broker).producer()
    for i in range(n):
        key = f"k{i % KEYS}".encode()
        p = partition_for_key(key, PARTITIONS)
        await producer.send("keys", b'"x"', key=key, partition=p, timestamp_ms=START + i)
    return broker


def hand_written(broker: MemoryBroker) -> Counter[bytes]:
    counts: Counter[bytes] = Counter()
    for p in range(PARTITIONS):
        for m in broker.messages("keys", p):
            counts[m.key or b""] += 1
    return counts


async def count_with(broker: MemoryBroker, n: int, ttl: float | None) -> int:
    """Count in a worker until ``n`` records are processed; the keys left in the table."""
    app = flowkit.App("ttl-bench", partitions=PARTITIONS, commit_interval=3600)
    keys = app.topic("keys", value_type=str)
    counts = app.table("counts", default=int, value_type=int, ttl=ttl)

    @app.agent(keys)
    async def count(stream: flowkit.Stream[str]) -> None:
        async for _ in stream:
            counts[stream.current.key] += 1

    worker = flowkit.Worker(app, transport=MemoryTransport(broker))
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < n or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    return len(worker.state.stores[counts])


async def part(name: str, n: int) -> None:
    broker = await loaded_broker(n)
    if name == "hand":
        hand_written(broker)
    elif name in TTLS:
        await count_with(broker, n, TTLS[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--instructions", action="store_true", help="under callgrind")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("warning")
    if args.instructions:
        others = [("ttl", "ttl=3600"), ("expiring", "ttl=2, expiring")]
        compare("benchmarks.ttl_count", "--records", args.records, "record", others)
        return
    if args.part:
        asyncio.run(part(args.part, args.records))
        return
    for name, ttl in TTLS.items():
        broker = asyncio.run(loaded_broker(args.records))
        started = time.perf_counter()
        left = asyncio.run(count_with(broker, args.records, ttl))
        seconds = time.perf_counter() - started
        print(f"{name:<9} ttl={ttl}: {args.records / seconds:,.0f} records/s, {left:,} keys left")


if __name__ == "__main__":
    main()
