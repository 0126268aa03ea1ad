"""Table stores: a restart from local state against a full replay; disk against memory.

    python -m benchmarks.state_stores [--keys 200000] [--repeat 3]
    python -m benchmarks.state_stores --rss --keys 10000000   # opt-in: a long run
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
* ``--rss``: one worker counting ``--keys`` distinct keys, committing every second, on
  each store in a process of its own, the two at once: its peak RSS, records per second
  and per CPU second (loading the input not counted), and the disk store's against the
  memory store's. The changelog's
  records are dropped from the memory broker as they come (Kafka keeps them elsewhere);
  the counts are checked. ``--store`` runs one store alone. Not in CI.
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
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import flowkit
from benchmarks.rounds import report
from flowkit.logs import configure_logging
from flowkit.records import TopicPartition
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


def drop_changelog(broker: MemoryBroker, table: Any) -> None:
    """Forget the changelog's records: Kafka keeps them on another machine, and the
    memory broker's copy would otherwise count in this process's RSS."""
    for p in range(table.partitions):
        log = broker.log(TopicPartition(table.changelog_topic, p))
        log.messages = []
        log.base = log.end
        log.gapped = False


async def count_distinct(store: str, n: int, data_dir: Path) -> dict[str, float]:
    """Count ``n`` distinct keys with one worker on ``store``, fed in chunks: the wall and
    CPU seconds (every thread of the process) it spent processing (loading the input is
    not counted), its peak RSS (MB) and the keys its table holds, each checked to be 1."""
    broker = MemoryBroker(retention_records=10_000)  # committed input is trimmed
    app, _, counts = make_app(store, data_dir if store == "rocksdb://" else None)
    worker = flowkit.Worker(
        app, transport=MemoryTransport(broker), commit_interval=1.0, status_interval=None
    )
    step = 100_000
    wall = cpu = 0.0
    deadline = time.perf_counter() + 4 * 3600
    async with worker:
        for start in range(0, n, step):
            end = min(n, start + step)
            load_keys(broker, [f"user-{i:09d}" for i in range(start, end)])
            started, started_cpu = time.perf_counter(), time.process_time()
            while worker.records_in < end or not worker.is_idle():
                if worker.error is not None or time.perf_counter() > deadline:
                    raise SystemExit(f"{store}: the worker stopped: {worker.error!r}")
                await asyncio.sleep(0.005)
            wall += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
            drop_changelog(broker, counts)
        await asyncio.sleep(1.5)  # a checkpoint: the last changes drained (and written)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the check
        table = worker.state.stores[counts]
        held = wrong = 0
        for _, value in table.items():
            held += 1
            wrong += value != 1
    if wrong:
        raise SystemExit(f"{store}: {wrong:,} of {held:,} counts are not 1")
    return {"seconds": wall, "cpu_seconds": cpu, "rss_mb": rss_mb, "keys": held}


def peak_rss(store: str, n: int) -> dict[str, float]:
    """Count ``n`` distinct keys on ``store`` in this process: see ``count_distinct``."""
    data_dir = Path(tempfile.mkdtemp(prefix="flowkit-bench-"))
    try:
        result = asyncio.run(count_distinct(store, n, data_dir))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    if result["keys"] != n:
        raise SystemExit(f"{store}: the table holds {result['keys']:,} keys, expected {n:,}")
    return result


def rss_pair(n: int) -> None:
    """Each store in a process of its own, both at once (a loaded machine slows both
    alike; records per CPU second do not depend on it): peak RSS, records/s, ratios."""
    command = [sys.executable, "-m", "benchmarks.state_stores", "--rss", "--keys", str(n)]
    stores = ("memory://", "rocksdb://")
    children = {
        store: subprocess.Popen(
            [*command, "--store", store, "--json"], stdout=subprocess.PIPE, text=True
        )
        for store in stores
    }
    results: dict[str, dict[str, float]] = {}
    for store, child in children.items():
        out, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"{store}: the run failed ({child.returncode})")
        results[store] = json.loads(out.strip().splitlines()[-1])
    print(f"the counting agent over {n:,} distinct keys, one worker process per store")
    for store, r in results.items():
        print(
            f"  {store:<11} peak RSS {r['rss_mb']:>7,.0f} MB   "
            f"{n / r['seconds']:>9,.0f} records/s ({r['seconds']:,.0f} s)   "
            f"{n / r['cpu_seconds']:>9,.0f} records per CPU second"
        )
    mem, disk = results["memory://"], results["rocksdb://"]
    print(
        f"rocksdb:// / memory://: peak RSS {disk['rss_mb'] / mem['rss_mb']:.2f}, "
        f"records/s {mem['seconds'] / disk['seconds']:.2f}, "
        f"records per CPU second {mem['cpu_seconds'] / disk['cpu_seconds']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--rss", action="store_true", help="peak RSS and records/s of each store (opt-in, long)"
    )
    parser.add_argument(
        "--store", help="--rss of this store alone (memory:// or rocksdb://), in this process"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--takeover", action="store_true", help="a takeover with a standby against without"
    )
    args = parser.parse_args()
    configure_logging("warning", "console")
    if args.rss and args.store is None:
        rss_pair(args.keys)
        return
    if args.rss:
        result = peak_rss(args.store, args.keys)
        print(json.dumps(result) if args.json else f"{args.store}: {result}")
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
