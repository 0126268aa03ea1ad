"""Windowed tables on disk: a tumbling count over many keys a window, rocksdb:// against memory://.

Peak RSS and records a second of one worker on each store.

    python -m benchmarks.window_keys --keys 1000000               # both stores, a process each
    python -m benchmarks.window_keys --keys 1000000 --store rocksdb://   # one, in this process
    python -m benchmarks.window_keys --keys 300000 --windows 6 --expires 3600  # keep them

The worker counts ``--windows`` consecutive 10 s windows (grace 0, closed windows readable
for ``--expires`` seconds, by default one more window), each with every one of ``--keys``
keys once, fed in chunks on the memory broker, committing every second; then a record
far ahead closes the rest. Every window's every key must come out once, with the count 1.
The memory broker is in the worker's process: the changelog's records are dropped as
they are written, and the input and the partials a closing window ships leave it once
committed (down to its retention of 10,000 records a partition), as on a Kafka broker,
whose memory is not the worker's. ``--keep-consumed`` keeps them until the next append
to their partition, as the broker itself does: then a window's partials count in the RSS
on both stores. The keys are made a chunk at a time, as they are loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flowkit
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.records import TopicPartition
from flowkit.transports import MemoryBroker, MemoryTransport

PARTITIONS = 4
SIZE_MS = 10_000
T0 = 1_700_000_000_000


def make_app(
    store: str, data_dir: Path | None, closed: list[int], expires: float | None = None
) -> tuple[flowkit.App, Any]:
    app = flowkit.App("wkeys", partitions=PARTITIONS, store=store, data_dir=data_dir)
    events: flowkit.Topic[int] = app.topic(
        "wk-events", value_type=int
    )  # the value is the event time (ms)

    def on_close(key: str, window: flowkit.Window, value: int) -> None:
        closed[0] += 1
        closed[1] += value != 1

    counts = app.table("counts", default=int).tumbling(
        SIZE_MS / 1000,
        grace=0,
        expires=expires,
        time=lambda t: t,
        idle_timeout=None,
        on_close=on_close,
    )

    @app.agent(events)
    async def count(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            counts[stream.current.key] += 1  # type: ignore[union-attr]

    return app, counts


def load(broker: MemoryBroker, keys: list[str], t: int) -> None:
    """Append one event per key at event time ``t``, each on its key's partition."""
    value = str(t).encode()
    for key in keys:
        raw = key.encode()
        broker.append("wk-events", value, key=raw, timestamp_ms=t)


def one_a_partition() -> list[str]:
    """A key on each partition: their records far ahead close every window there."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(partition_for_key(f"flush-{i}".encode(), PARTITIONS), f"flush-{i}")
    return list(found.values())


def chunks(n: int, windows: int, step: int) -> Iterator[tuple[int, list[str]]]:
    """Each window's keys a chunk of ``step`` at a time, made as they are loaded (held
    whole, the keys of every window would weigh more than a store's state), then the
    records far ahead that close every window."""
    for w in range(windows):
        for start in range(0, n, step):
            yield T0 + w * SIZE_MS, [f"user-{i:09d}" for i in range(start, min(n, start + step))]
    yield T0 + 3_600_000, one_a_partition()


def forget_changelog(broker: MemoryBroker, changelog: str) -> None:
    """The changelog's records are acknowledged and dropped as they come: Kafka keeps them
    on another machine, and in the worker's process they would outweigh its state."""
    append_batch = broker.append_batch

    def append_and_forget(topic: str, partition: int, records: Any) -> Any:
        ack = append_batch(topic, partition, records)
        if topic == changelog:
            log = broker.log(TopicPartition(topic, partition))
            log.messages = []
            log.base = log.end
            log.gapped = False
        return ack

    broker.append_batch = append_and_forget  # type: ignore[method-assign]


async def drop_consumed(broker: MemoryBroker, topics: list[str]) -> None:
    """Records every group committed leave the broker (down to its retention) at once,
    not at the next append: a Kafka broker holds them in another process, and here a
    closing window's partials, read and committed, would weigh as much as its state."""
    while True:
        for topic in topics:
            for p in range(broker.partition_count(topic) or 0):
                tp = TopicPartition(topic, p)
                broker._trim(tp, broker.log(tp))
        await asyncio.sleep(0.05)


async def count_windows(
    store: str,
    n: int,
    windows: int,
    data_dir: Path,
    settle: float = 1.5,
    expires: float | None = None,
    keep_consumed: bool = False,
) -> dict[str, float]:
    broker = MemoryBroker(retention_records=10_000)
    closed = [0, 0]  # keys of closed windows, and those whose count was not 1
    app, counts = make_app(store, data_dir if store == "rocksdb://" else None, closed, expires)
    transport = MemoryTransport(broker)
    broker.create_topic("wk-events", PARTITIONS)
    forget_changelog(broker, counts.changelog_topic)
    worker = flowkit.Worker(app, transport=transport, commit_interval=1.0, status_interval=None)
    step = 100_000
    wall = cpu = 0.0
    records = 0
    async with worker:
        if not keep_consumed:
            dropping = asyncio.ensure_future(
                drop_consumed(broker, ["wk-events", counts.repartition_topic])
            )
        for t, keys in chunks(n, windows, step):
            load(broker, keys, t)
            records += len(keys)
            started, started_cpu = time.perf_counter(), time.process_time()
            while worker.records_in < records or not worker.is_idle():
                if worker.error is not None:
                    raise SystemExit(f"{store}: the worker stopped: {worker.error!r}")
                await asyncio.sleep(0.005)
            wall += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
        deadline = time.monotonic() + 600
        while closed[0] < n * windows and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(settle)  # a checkpoint
        if not keep_consumed:
            dropping.cancel()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if closed[0] != n * windows or closed[1]:
        wrong = f"{closed[0]:,} keys closed of {n * windows:,}, {closed[1]:,} not 1"
        raise SystemExit(f"{store}: {wrong}")
    return {"seconds": wall, "cpu_seconds": cpu, "rss_mb": peak, "records": records}


def measure(
    store: str, n: int, windows: int, expires: float | None, keep_consumed: bool = False
) -> dict[str, float]:
    configure_logging("warning")
    with tempfile.TemporaryDirectory() as data_dir:
        return asyncio.run(
            count_windows(
                store, n, windows, Path(data_dir), expires=expires, keep_consumed=keep_consumed
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument(
        "--expires", type=float, help="seconds closed windows stay readable (default: 10)"
    )
    parser.add_argument("--store", help="one store (memory:// or rocksdb://), in this process")
    parser.add_argument(
        "--keep-consumed",
        action="store_true",
        help="the broker keeps committed records until its next append (as before 2026-12-02)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.store:
        result = measure(args.store, args.keys, args.windows, args.expires, args.keep_consumed)
        print(json.dumps(result) if args.json else result)
        return
    results = {}
    for store in ("memory://", "rocksdb://"):
        command = [sys.executable, "-m", "benchmarks.window_keys", "--keys", str(args.keys)]
        command += ["--windows", str(args.windows), "--store", store, "--json"]
        if args.expires is not None:
            command += ["--expires", str(args.expires)]
        if args.keep_consumed:
            command.append("--keep-consumed")
        out = subprocess.run(command, check=True, capture_output=True, text=True)
        r = results[store] = json.loads(out.stdout.splitlines()[-1])
        print(
            f"{store:<11} peak RSS {r['rss_mb']:>7,.0f} MB   "
            f"{r['records'] / r['seconds']:>9,.0f} records/s   "
            f"{r['records'] / r['cpu_seconds']:>9,.0f} per CPU second"
        )
    mem, disk = results["memory://"], results["rocksdb://"]
    print(
        f"rocksdb:// / memory://: peak RSS {disk['rss_mb'] / mem['rss_mb']:.2f}, "
        f"records/s {mem['seconds'] / disk['seconds']:.2f}, "
        f"per CPU second {mem['cpu_seconds'] / disk['cpu_seconds']:.2f}"
    )


if __name__ == "__main__":
    main()
