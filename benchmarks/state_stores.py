"""Table stores: a restart from local state against a full replay; disk against memory.

    python -m benchmarks.state_stores [--keys 200000] [--repeat 3]
    python -m benchmarks.state_stores --rss --keys 10000000 --store rocksdb://   # opt-in
    python -m benchmarks.state_stores --rss --keys 10000000 --store memory://
    python -m benchmarks.state_stores --takeover [--keys 200000] [--repeat 3]

On the memory broker, with a counting agent (``counts[key] += 1``) over a 4-partition topic:

* **restart**: a worker counts one record of each of ``--keys`` keys and stops cleanly
  (its local state written); then 1 % of the keys change in the changelog (as another
  worker would write them while this one was away), and a new worker starts. Timed from
  its start until it is ready (joined, tables recovered), in paired rounds: ``rocksdb://``
  and ``memory://`` with a data directory (its snapshots) replay the 1 % tail, against
  ``memory://`` without one, which replays the whole changelog. The counts are checked.
* **throughput**: the same agent over ``--keys`` records of ``--keys // 10`` keys, records
  per second from start to idle on ``rocksdb://`` against ``memory://``.
* ``--rss``: peak RSS of one worker counting ``--keys`` distinct keys on one store (run it
  once per store: each run is its own process). Not in CI.
* ``--takeover``: two workers share the 4 partitions of a table of ``--keys`` keys; one
  leaves, and the other takes its partitions over. Timed from the moment it left until
  the other is ready holding every partition, in paired rounds: with standby replicas
  (``App(standby_replicas=1)``: the gap only) against without (the partitions' whole
  changelogs). The counts are checked.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import flowkit
from benchmarks.rounds import report
from flowkit.logs import configure_logging
from flowkit.testing import TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport

APP = "stores-bench"
PARTITIONS = 4


def make_app(
    store: str, data_dir: Path | None, standby_replicas: int = 0
) -> tuple[flowkit.App, Any, Any]:
    """A counting agent on ``store``."""
    app = flowkit.App(
        APP,
        partitions=PARTITIONS,
        store=store,
        data_dir=data_dir,
        standby_replicas=standby_replicas,
    )
    keys = app.topic(f"{APP}-keys", value_type=str)
    counts = app.table("counts", default=int, value_type=int)

    @app.agent(keys)
    async def count(stream: flowkit.Stream[str]) -> None:
        async for key in stream:
            counts[key] += 1

    return app, keys, counts


def load_keys(broker: MemoryBroker, keys: list[str]) -> None:
    """Append one record per key to the input topic, keyed by itself."""
    topic = f"{APP}-keys"
    if broker.partition_count(topic) is None:
        broker.create_topic(topic, PARTITIONS)
    for key in keys:
        raw = key.encode()
        broker.append(topic, raw, key=raw)


async def run_to_idle(app: flowkit.App, broker: MemoryBroker, **options: Any) -> float:
    """Seconds from a worker's start until it has processed everything (it then stops)."""
    started = time.perf_counter()
    async with TestDriver(app, broker=broker, **options) as driver:
        await driver.run_until_idle(timeout=3600)
        elapsed = time.perf_counter() - started
    return elapsed


async def start_to_ready(
    app: flowkit.App, broker: MemoryBroker, data_dir: Path | None, table: Any
) -> tuple[float, dict[str, int]]:
    """Seconds from a worker's start until it is ready, and then its table."""
    worker = flowkit.Worker(app, transport=MemoryTransport(broker), data_dir=data_dir)
    started = time.perf_counter()
    async with worker:
        deadline = started + 3600
        while not worker.ready:
            if worker.error is not None or time.perf_counter() > deadline:
                raise SystemExit(f"the worker did not become ready: {worker.error!r}")
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - started
        return elapsed, dict(worker.state.stores[table].items())


def restart_round(keys: list[str]) -> dict[str, float]:
    """One paired round of the restart comparison."""
    out: dict[str, float] = {}
    changed = keys[: max(1, len(keys) // 100)]
    for label, store, local in (
        ("full replay (memory://)", "memory://", False),
        ("snapshot (memory:// + data_dir)", "memory://", True),
        ("rocksdb://", "rocksdb://", True),
    ):
        data_dir = Path(tempfile.mkdtemp(prefix="flowkit-bench-")) if local else None
        try:
            broker = MemoryBroker(retention_records=None)
            load_keys(broker, keys)
            app, _, _ = make_app(store, data_dir)
            asyncio.run(run_to_idle(app, broker))
            load_keys(broker, changed)  # the 1 % tail: counted by a worker with no state
            app, _, _ = make_app(store, None)
            elsewhere = Path(tempfile.mkdtemp(prefix="flowkit-bench-"))
            asyncio.run(run_to_idle(app, broker, data_dir=elsewhere))
            shutil.rmtree(elsewhere, ignore_errors=True)
            gc.collect()
            app, _, counts = make_app(store, data_dir)
            out[label], table = asyncio.run(start_to_ready(app, broker, data_dir, counts))
            want = {key: 1 for key in keys} | {key: 2 for key in changed}
            if table != want:
                wrong = sum(1 for k in want if table.get(k) != want[k])
                raise SystemExit(f"{label}: {wrong:,} of {len(want):,} counts are wrong")
        finally:
            if data_dir is not None:
                shutil.rmtree(data_dir, ignore_errors=True)
    return out


async def takeover(keys: list[str], standby_replicas: int) -> float:
    """Seconds from one of two workers leaving until the other is ready with its
    partitions; the counts are checked."""
    broker = MemoryBroker(retention_records=None)
    load_keys(broker, keys)
    app, _, counts = make_app("memory://", None, standby_replicas)
    staying = flowkit.Worker(app, transport=MemoryTransport(broker))
    leaving = flowkit.Worker(app, transport=MemoryTransport(broker))
    deadline = time.perf_counter() + 3600

    def wait(what: str) -> None:
        if time.perf_counter() > deadline or staying.error or leaving.error:
            raise SystemExit(f"{what}: {staying.error or leaving.error!r}")

    async with staying:
        await leaving.start()
        try:
            # Until the two share the partitions and the input is counted (and copied).
            while not (
                staying.ready
                and leaving.ready
                and staying.state.stores[counts].held()
                and leaving.state.stores[counts].held()
                and staying.is_idle()
                and leaving.is_idle()
                and staying.state.standbys.lag() == 0
            ):
                wait("the workers did not share the partitions")
                await asyncio.sleep(0.001)
        finally:
            await leaving.aclose()
        started = time.perf_counter()
        await asyncio.sleep(0)
        while not (staying.ready and len(staying.state.stores[counts].held()) == PARTITIONS):
            wait("the partitions were not taken over")
            await asyncio.sleep(0.0005)
        elapsed = time.perf_counter() - started
        table = dict(staying.state.stores[counts].items())
    if table != {key: 1 for key in keys}:
        raise SystemExit(f"standby_replicas={standby_replicas}: the counts are wrong")
    return elapsed


def takeover_round(keys: list[str]) -> dict[str, float]:
    """One paired round of the takeover comparison."""
    out: dict[str, float] = {}
    for label, replicas in (("without standby", 0), ("with standby", 1)):
        gc.collect()
        out[label] = asyncio.run(takeover(keys, replicas))
    return out


def throughput_round(records: int) -> dict[str, float]:
    """One paired round: the counting agent on each store, start to idle."""
    keys = [f"user-{i % max(1, records // 10):08d}" for i in range(records)]
    out: dict[str, float] = {}
    for label, store in (("memory://", "memory://"), ("rocksdb://", "rocksdb://")):
        data_dir = Path(tempfile.mkdtemp(prefix="flowkit-bench-"))
        try:
            broker = MemoryBroker(retention_records=None)
            load_keys(broker, keys)
            app, _, _ = make_app(store, data_dir if store == "rocksdb://" else None)
            gc.collect()
            out[label] = asyncio.run(run_to_idle(app, broker))
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)
    return out


def peak_rss(store: str, n: int) -> None:
    """Count ``n`` distinct keys on ``store``; print the peak RSS."""
    data_dir = Path(tempfile.mkdtemp(prefix="flowkit-bench-"))
    try:
        broker = MemoryBroker(retention_records=1)  # the input is not what is measured
        app, _, _ = make_app(store, data_dir if store == "rocksdb://" else None)
        step = 500_000

        async def run() -> None:
            async with TestDriver(app, broker=broker) as driver:
                for start in range(0, n, step):
                    load_keys(broker, [f"user-{i:09d}" for i in range(start, min(n, start + step))])
                    await driver.run_until_idle(timeout=3600)

        started = time.perf_counter()
        asyncio.run(run())
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{store}: {n:,} keys counted in {time.perf_counter() - started:.0f} s, "
            f"peak RSS {rss_mb:,.0f} MB"
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rss", action="store_true", help="peak RSS of one store (opt-in)")
    parser.add_argument("--store", default="rocksdb://", help="the store of --rss")
    parser.add_argument(
        "--takeover", action="store_true", help="a takeover with a standby against without"
    )
    args = parser.parse_args()
    configure_logging("warning", "console")
    if args.rss:
        peak_rss(args.store, args.keys)
        return
    keys = [f"user-{i:08d}" for i in range(args.keys)]
    if args.takeover:
        print(f"takeover of a worker's partitions, {args.keys:,} keys: left to ready")
        rounds = [takeover_round(keys) for _ in range(args.repeat)]
        report(
            rounds,
            args.keys,
            "key",
            [("with standby / without", "with standby", "without standby")],
        )
        for label in rounds[0]:
            seconds = statistics.median(r[label] for r in rounds)
            print(f"{label}: {seconds * 1000:,.1f} ms from leaving to ready (median)")
        return
    print(f"restart after a clean stop, {args.keys:,} keys, 1 % changed since: start to ready")
    rounds = [restart_round(keys) for _ in range(args.repeat)]
    base = "full replay (memory://)"
    report(
        rounds,
        args.keys,
        "key",
        [(f"{label} / full replay", label, base) for label in rounds[0] if label != base],
    )
    print(f"\nthe counting agent, {args.keys:,} records of {args.keys // 10:,} keys")
    rounds = [throughput_round(args.keys) for _ in range(args.repeat)]
    report(rounds, args.keys, "record", [("rocksdb:// / memory://", "rocksdb://", "memory://")])


if __name__ == "__main__":
    main()
