"""Table stores: a restart from local state against a full replay; disk against memory.

    python -m benchmarks.state_stores [--keys 1000000] [--repeat 3] [--brokers memory,tansu]
    python -m benchmarks.state_stores --throughput [--keys 200000] [--repeat 3]
    python -m benchmarks.state_stores --rss --keys 10000000   # opt-in: a long run
    python -m benchmarks.state_stores --takeover [--windowed] [--keys 200000] [--repeat 3]

A counting table (``counts[key] += 1``) over 4 partitions:

* **restart** (the default), on the memory broker and on Tansu (started for the run, or
  ``--bootstrap`` a running Kafka): the table's changelog holds ``--keys`` keys, each
  counted once. A first worker, in a process of its own, recovers it into a data
  directory and checkpoints (its databases, or its memory store's snapshots, stamped
  with the changelog offset; the time that checkpoint took is printed), then stops
  cleanly, or is killed (SIGKILL) right after that checkpoint. Four of them:
  ``rocksdb://`` and ``memory://`` with a data directory (snapshots), each stopped both
  ways. (On the memory broker, whose log lives in the
  worker's process, each first worker writes the same changelog into its own broker
  first, as the benchmark's process does into its own: the same keys in the same order,
  the same offsets.) Then 1 % of the keys change in the changelog (as another worker
  would write them), and a new worker starts on a copy of what each first worker left,
  timed from its start until it is ready (joined, tables recovered), and by its table
  recovery alone (what its ``tables recovered`` line says), in paired rounds against
  ``memory://`` without a data directory, which replays the whole changelog. Every
  restarted table is checked. The ratios full replay / restart are printed.
* ``--throughput``: the same agent over ``--keys`` records of ``--keys // 10`` keys,
  records per second from start to idle on ``rocksdb://`` against ``memory://``.
* ``--rss``: one worker counting ``--keys`` distinct keys, committing every second, on
  each store in a process of its own, the two at once: its peak RSS, records per second
  and per CPU second (loading the input not counted), and the disk store's against the
  memory store's. The changelog's
  records are dropped from the memory broker as they come (Kafka keeps them elsewhere);
  the counts are checked. ``--store`` runs one store alone. Not in CI.
* ``--takeover``: two workers share the 4 partitions of a table of ``--keys`` keys; one
  leaves, and the other takes its partitions over. Timed from the moment it left until
  the other is ready holding every partition, in paired rounds, on ``memory://`` and on
  ``rocksdb://`` (each worker with a data directory of its own): with standby replicas
  (``App(standby_replicas=1)``: the gap only) against without (the partitions' whole
  changelogs). The counts are checked. ``--windowed``: the table is a tumbling windowed
  table of one hour (every key's partial open in stage 1), not a plain one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import flowkit
from benchmarks.kafka_broker import kafka_broker
from benchmarks.rounds import report
from flowkit.logs import configure_logging
from flowkit.records import TopicPartition
from flowkit.runtime.tables.keeper import StateKeeper
from flowkit.testing import TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport, OutRecord, transport_from_url

APP = "stores-bench"
PARTITIONS = 4


def make_app(
    store: str, data_dir: Path | None, standby_replicas: int = 0, *, windowed: bool = False
) -> tuple[flowkit.App, Any, Any]:
    """A counting agent on ``store``; ``windowed``: into windows of an hour (by the
    records' timestamps), not a plain table."""
    app = flowkit.App(
        APP,
        partitions=PARTITIONS,
        store=store,
        data_dir=data_dir,
        standby_replicas=standby_replicas,
    )
    keys = app.topic(f"{APP}-keys", value_type=str)
    counts: Any = app.table("counts", default=int, value_type=int)
    if windowed:
        counts = counts.tumbling(3600.0, idle_timeout=None)

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


# -- restart after a clean stop or a kill -9 ----------------------------------------------

FULL = "full replay (memory://)"
# (label, store, stop): the forms that restart from local state, each after its stop.
LOCAL_FORMS = (
    ("rocksdb://, clean stop", "rocksdb://", "clean"),
    ("rocksdb://, kill -9", "rocksdb://", "kill"),
    ("snapshot, clean stop", "memory://", "clean"),
    ("snapshot, kill -9", "memory://", "kill"),
)


def changelog_app(store: str) -> tuple[flowkit.App, Any]:
    """The counting app, its local state snapshotted at every checkpoint (a memory store
    with a data directory), and its table."""
    app, _, counts = make_app(store, None)
    app.snapshot_interval = 0.001
    return app, counts


def transport_for(url: str, broker: MemoryBroker | None) -> Any:
    """A transport to the run's broker: the memory broker given, or Kafka at ``url``."""
    return MemoryTransport(broker) if broker is not None else transport_from_url(url)


async def write_changelog(transport: Any, items: list[tuple[str, int]]) -> None:
    """Write ``items`` (key, count) to the table's changelog, as a counting worker would
    (each key to its partition, encoded by the table's codecs)."""
    app, counts = changelog_app("memory://")
    await transport.create_topics(StateKeeper.specs_for(app))
    by_partition: dict[int, list[OutRecord]] = {}
    encode = counts.value_codec.encode
    for key, value in items:
        record = (counts.encode_key(key), encode(value), (), None)
        by_partition.setdefault(counts.partition_of(key), []).append(record)
    producer = transport.producer()
    await producer.start()
    try:
        for p, records in sorted(by_partition.items()):
            for i in range(0, len(records), 5_000):
                await producer.send_batch(counts.changelog_topic, p, records[i : i + 5_000])
        await producer.flush()
    finally:
        await producer.aclose()


def preload(url: str, keys: list[str]) -> MemoryBroker | None:
    """The changelog of a table of ``keys``, each counted once: written to Kafka at
    ``url``, or to a new memory broker (returned). The same keys give the same offsets."""
    broker = MemoryBroker(retention_records=None) if url == "memory://" else None
    asyncio.run(write_changelog(transport_for(url, broker), [(key, 1) for key in keys]))
    return broker


async def first_run(url: str, broker: MemoryBroker | None, store: str, data_dir: Path) -> None:
    """Recover the table into ``data_dir`` (its own worker, group and process), checkpoint,
    say so on stdout; then wait to be killed (``--kill``) or stop cleanly."""
    app, _ = changelog_app(store)
    worker = flowkit.Worker(
        app,
        transport=transport_for(url, broker),
        data_dir=data_dir,
        commit_interval=3600,  # the one checkpoint below, then no other before the kill
        status_interval=None,
    )
    async with worker:
        deadline = time.perf_counter() + 3600
        while not worker.ready:
            if worker.error is not None or time.perf_counter() > deadline:
                raise SystemExit(f"the first worker did not become ready: {worker.error!r}")
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        await worker.checkpoint()  # writes the snapshots (and flushes the databases)
        print(f"checkpointed {time.perf_counter() - started:.6f}", flush=True)
        if KILL:
            await asyncio.sleep(3600)  # the parent kills this process now (SIGKILL)


# A killed member leaves the group when its session times out: soon, for the next run.
KAFKA_QUERY = "session_timeout_ms=2000&heartbeat_interval_ms=400"
KILL = False  # set by --kill in a first run's process


def run_first(url: str, store: str, data_dir: Path, keys: int, stop: str) -> float:
    """A first run in a process of its own (``--first-run``): a clean stop, or a kill -9
    of the process after its checkpoint; returns the seconds that checkpoint took."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.state_stores",
        "--first-run",
        store,
        "--url",
        url,
        "--data-dir",
        str(data_dir),
        "--keys",
        str(keys),
        *(["--kill"] if stop == "kill" else []),
    ]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # "checkpointed <seconds>", or "" if it failed
        if not line.startswith("checkpointed "):
            child.wait(timeout=600)
            raise SystemExit(f"the first run ({store}, {stop}) failed ({child.returncode})")
        if stop == "kill":
            child.send_signal(signal.SIGKILL)
        if child.wait(timeout=600) not in (0, -signal.SIGKILL):
            raise SystemExit(f"the first run ({store}, {stop}) failed ({child.returncode})")
        return float(line.split()[1])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def restart(
    url: str, broker: MemoryBroker | None, store: str, data_dir: Path | None
) -> tuple[float, float, dict[str, int]]:
    """Seconds from a worker's start until it is ready, and of its table recovery alone
    (as its ``tables recovered`` line says), and then its table."""
    app, counts = changelog_app(store)
    worker = flowkit.Worker(
        app,
        transport=transport_for(url, broker),
        data_dir=data_dir,
        status_interval=None,
    )
    recovering = worker.state.recover
    recovery = [0.0]

    async def timed(partitions: Any) -> None:
        started = time.perf_counter()
        await recovering(partitions)
        recovery[0] += time.perf_counter() - started

    worker.state.recover = timed  # type: ignore[method-assign]
    started = time.perf_counter()
    async with worker:
        deadline = started + 3600
        while not worker.ready:
            if worker.error is not None or time.perf_counter() > deadline:
                raise SystemExit(f"the worker did not become ready: {worker.error!r}")
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - started
        return elapsed, recovery[0], dict(worker.state.stores[counts].items())


def restart_rounds(url: str, keys: list[str], repeat: int) -> list[dict[str, tuple[float, float]]]:
    """The restart comparison on one broker: the first runs (a process each), 1 % of the
    keys changed in the changelog since, then paired rounds of restarts, each from a copy
    of what its first run left. Every restarted table is checked."""
    broker = preload(url, keys)
    work = Path(tempfile.mkdtemp(prefix="flowkit-bench-"))
    try:
        left: dict[str, Path] = {}
        for label, store, stop in LOCAL_FORMS:
            left[label] = work / f"first-{len(left)}"
            took = run_first(url, store, left[label], len(keys), stop)
            print(f"  first run, {label}: its checkpoint took {took * 1000:,.0f} ms")
        changed = keys[::100]
        asyncio.run(write_changelog(transport_for(url, broker), [(key, 2) for key in changed]))
        if broker is None:  # the group forgets the killed member (KAFKA_QUERY's timeout)
            time.sleep(3)
        want = {key: 1 for key in keys} | {key: 2 for key in changed}
        rounds = []
        for n in range(repeat):
            out: dict[str, tuple[float, float]] = {}
            forms = [(FULL, "memory://", None), *LOCAL_FORMS]
            for i, (label, store, _) in enumerate(forms if n % 2 == 0 else forms[::-1]):
                data_dir = None
                if label != FULL:
                    data_dir = work / f"round-{n}-{i}"
                    shutil.copytree(left[label], data_dir)
                gc.collect()
                start, recovery, table = asyncio.run(restart(url, broker, store, data_dir))
                if table != want:
                    wrong = sum(1 for k in want if table.get(k) != want[k])
                    raise SystemExit(f"{label}: {wrong:,} of {len(want):,} counts are wrong")
                del table
                out[label] = (start, recovery)
                if data_dir is not None:
                    shutil.rmtree(data_dir, ignore_errors=True)
            rounds.append({label: out[label] for label in [FULL, *(f[0] for f in LOCAL_FORMS)]})
        return rounds
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report_restarts(rounds: list[dict[str, tuple[float, float]]]) -> None:
    """Per form: start to ready and the recovery alone, medians and ranges; the ratios
    full replay / restart, medians and ranges of the per-round ratios."""
    print(f"{len(rounds)} paired rounds; median (range)")
    print(f"{'':<26} {'start to ready, s':>22} {'recovery, s':>22} {'full / this':>24}")
    for label in rounds[0]:
        cells = []
        for which in (0, 1):
            seconds = sorted(r[label][which] for r in rounds)
            cells.append(f"{statistics.median(seconds):.3f} ({seconds[0]:.3f}-{seconds[-1]:.3f})")
        ratios = sorted(r[FULL][0] / r[label][0] for r in rounds)
        recovery = sorted(r[FULL][1] / r[label][1] for r in rounds)
        ratio = (
            f"{statistics.median(ratios):5.1f}x / {statistics.median(recovery):5.1f}x"
            if label != FULL
            else ""
        )
        print(f"{label:<26} {cells[0]:>22} {cells[1]:>22} {ratio:>24}")
    print("full / this: ready, then recovery alone; ranges of the ratios:")
    for label in list(rounds[0])[1:]:
        ratios = sorted(r[FULL][0] / r[label][0] for r in rounds)
        recovery = sorted(r[FULL][1] / r[label][1] for r in rounds)
        print(
            f"  {label:<24} ready {ratios[0]:.1f}-{ratios[-1]:.1f}x, "
            f"recovery {recovery[0]:.1f}-{recovery[-1]:.1f}x"
        )


TAKEOVER_STORES = ("memory://", "rocksdb://")


async def takeover(
    keys: list[str], store: str, standby_replicas: int, work: Path, *, windowed: bool = False
) -> float:
    """Seconds from one of two workers leaving until the other is ready with its
    partitions; the counts are checked. Each worker has a data directory of its own
    under ``work`` (the memory store's is not used: it has no snapshot interval)."""
    broker = MemoryBroker(retention_records=None)
    load_keys(broker, keys)
    app, _, counts = make_app(store, None, standby_replicas, windowed=windowed)
    data = None if store == "memory://" else (work / "staying", work / "leaving")
    staying = flowkit.Worker(app, transport=MemoryTransport(broker), data_dir=data and data[0])
    leaving = flowkit.Worker(app, transport=MemoryTransport(broker), data_dir=data and data[1])
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
        held = staying.state.stores[counts]
        if windowed:
            table = {key: sum(held.windows(key).values()) for key in keys}
        else:
            table = dict(held.items())
    if table != {key: 1 for key in keys}:
        raise SystemExit(f"{store}, standby_replicas={standby_replicas}: the counts are wrong")
    return elapsed


def takeover_round(keys: list[str], *, windowed: bool = False) -> dict[str, float]:
    """One paired round of the takeover comparison, on each store."""
    out: dict[str, float] = {}
    for store in TAKEOVER_STORES:
        for label, replicas in (("without", 0), ("with standby", 1)):
            work = Path(tempfile.mkdtemp(prefix="flowkit-bench-"))
            try:
                gc.collect()
                out[f"{store} {label}"] = asyncio.run(
                    takeover(keys, store, replicas, work, windowed=windowed)
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
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
    parser.add_argument("--keys", type=int, help="default: 1,000,000 (restart), else 200,000")
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
    parser.add_argument(
        "--windowed", action="store_true", help="--takeover: of a tumbling windowed table"
    )
    parser.add_argument(
        "--brokers",
        default="memory,tansu",
        help="the restart's brokers, of memory and tansu (default: both)",
    )
    parser.add_argument("--bootstrap", help="host:port of a running Kafka instead of Tansu")
    parser.add_argument(
        "--throughput", action="store_true", help="the counting agent's records/s on each store"
    )
    parser.add_argument("--first-run", help=argparse.SUPPRESS)  # a restart's first worker
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--kill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("warning", "console")
    if args.keys is None:
        restarts = not (args.takeover or args.throughput or args.rss or args.first_run)
        args.keys = 1_000_000 if restarts else 200_000
    if args.rss and args.store is None:
        rss_pair(args.keys)
        return
    if args.rss:
        result = peak_rss(args.store, args.keys)
        print(json.dumps(result) if args.json else f"{args.store}: {result}")
        return
    keys = [f"user-{i:08d}" for i in range(args.keys)]
    if args.first_run is not None:
        global KILL
        KILL = args.kill
        broker = preload(args.url, keys) if args.url == "memory://" else None
        asyncio.run(first_run(args.url, broker, args.first_run, Path(args.data_dir)))
        return
    if args.takeover:
        what = "a windowed table" if args.windowed else "a table"
        print(f"takeover of a worker's partitions of {what}, {args.keys:,} keys: left to ready")
        rounds = [takeover_round(keys, windowed=args.windowed) for _ in range(args.repeat)]
        report(
            rounds,
            args.keys,
            "key",
            [
                (f"{store} with standby / without", f"{store} with standby", f"{store} without")
                for store in TAKEOVER_STORES
            ],
        )
        for label in rounds[0]:
            seconds = sorted(r[label] for r in rounds)
            print(
                f"{label}: {statistics.median(seconds) * 1000:,.1f} ms from leaving to ready"
                f" (median; {seconds[0] * 1000:,.1f}-{seconds[-1] * 1000:,.1f})"
            )
        return
    if args.throughput:
        print(f"the counting agent, {args.keys:,} records of {args.keys // 10:,} keys")
        rounds = [throughput_round(args.keys) for _ in range(args.repeat)]
        report(rounds, args.keys, "record", [("rocksdb:// / memory://", "rocksdb://", "memory://")])
        return
    for broker_name in args.brokers.split(","):
        print(
            f"\nrestart on the {broker_name} broker, {args.keys:,} keys, 1 % changed since the"
            " first run's checkpoint: start to ready"
        )
        if broker_name == "memory":
            report_restarts(restart_rounds("memory://", keys, args.repeat))
            continue
        with kafka_broker(args.bootstrap) as (address, _):
            url = f"kafka://{address}?{KAFKA_QUERY}"
            report_restarts(restart_rounds(url, keys, args.repeat))


if __name__ == "__main__":
    main()
