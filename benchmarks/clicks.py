"""The clicks that the session and sliding benchmarks count, and what both do with them:
load them on the memory broker, run a worker over them, and measure the peak RSS of a run
on each store.

N clicks of ``users`` users (some click far more), keyed by user on 4 partitions, one
every 10 ms of event time with up to 200 ms of disorder; then one click far ahead per
partition, which closes every window and session.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

import flowkit
from benchmarks.window_keys import forget_changelog
from benchmarks.ysb import Seconds
from flowkit.partitioning import partition_for_key
from flowkit.transports import MemoryBroker, MemoryTransport

START_MS = 1_700_000_000_000
PARTITIONS = 4
USERS = 5000
Data = list[tuple[int, bytes, bytes, int]]  # (partition, key, value, timestamp)
Result = list[tuple[str, int, int, int]]  # (user, start, end, clicks), sorted
MakeApp = Callable[[Result, Path | None, float | None], flowkit.App]


class Click(msgspec.Struct):
    user: str
    t: int


def data_set(n: int, users_n: int = USERS) -> Data:
    rng = random.Random(7)
    enc = msgspec.json.Encoder()
    users = [f"user-{i}" for i in range(users_n)]
    weights = [1.0 / (1 + i % 50) for i in range(users_n)]  # some users click far more
    out: Data = []
    for i, user in enumerate(rng.choices(users, weights, k=n)):
        ts = START_MS + i * 10 - rng.randrange(200)
        key = user.encode()
        out.append((partition_for_key(key, PARTITIONS), key, enc.encode(Click(user, ts)), ts))
    end = START_MS + n * 10 + 3_600_000
    for p in range(PARTITIONS):  # far ahead: every window and session closes
        out.append((p, b"", enc.encode(Click("", end)), end))
    return out


async def loaded_broker(data: Data) -> MemoryBroker:
    broker = MemoryBroker(retention_records=None)
    broker.create_topic("clicks", PARTITIONS)
    producer = MemoryTransport(broker).producer()
    for p, key, raw, ts in data:
        await producer.send("clicks", raw, key=key, partition=p, timestamp_ms=ts)
    return broker


async def run_worker(app: flowkit.App, broker: MemoryBroker, n: int) -> Seconds:
    start, cpu = time.perf_counter(), time.process_time()
    worker = flowkit.Worker(app, transport=MemoryTransport(broker))
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < n or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    return Seconds(time.perf_counter() - start, time.process_time() - cpu)


async def run_on(
    data: Data, make_app: MakeApp, store: str, expires: float | None = None
) -> tuple[Seconds, Result, MemoryBroker]:
    """One run of the query on ``store`` (a fresh data directory for ``rocksdb``): its
    seconds, its windows sorted, and the broker (for the hand-written loop over its logs)."""
    broker = await loaded_broker(data)
    closed: Result = []
    data_dir = Path(tempfile.mkdtemp(prefix="clicksbench-")) if store == "rocksdb" else None
    try:
        elapsed = await run_worker(make_app(closed, data_dir, expires), broker, len(data))
    finally:
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    return elapsed, sorted(closed), broker


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


class _Count(list[Any]):
    """Counts the windows closed, keeping none (their list is not the worker's state)."""

    n = 0

    def append(self, item: Any) -> None:
        self.n += 1


async def rss_of(
    data: Data, make_app: MakeApp, changelog: str, store: str, expires: float | None
) -> None:
    """One run on ``store``: prints the peak RSS's growth over the loaded broker (MB),
    the run's seconds and its windows (``--part rss``, in a process of its own). The
    changelog's records are dropped as they are written, as in ``window_keys``: Kafka
    keeps them on another machine."""
    broker = await loaded_broker(data)
    before = _rss_mb()
    closed = _Count()
    data_dir = Path(tempfile.mkdtemp(prefix="clicksbench-")) if store == "rocksdb" else None
    app = make_app(closed, data_dir, expires)
    forget_changelog(broker, changelog)
    try:
        elapsed = await run_worker(app, broker, len(data))
    finally:
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{peak - before:.1f} {float(elapsed):.3f} {closed.n}")


def rss_pair(module: str, args: argparse.Namespace, what: str) -> None:
    """Each store's peak RSS growth and seconds, each in a process of its own
    (``python -m module --part rss``); ``what`` the module's windows are called."""
    out = {}
    for store in ("memory", "rocksdb"):
        command = [sys.executable, "-m", module, "--part", "rss"]
        command += ["--store", store, "--clicks", str(args.clicks), "--users", str(args.users)]
        if args.expires is not None:
            command += ["--expires", str(args.expires)]
        grew, wall, windows = subprocess.run(
            command, capture_output=True, text=True, check=True
        ).stdout.split()
        out[store] = float(grew), float(wall)
        print(
            f"  {store:<8} peak RSS +{float(grew):>7,.0f} MB over the loaded broker, "
            f"{float(wall):.2f} s, {int(windows):,} {what}"
        )
    (mem, mem_s), (disk, disk_s) = out["memory"], out["rocksdb"]
    print(f"rocksdb / memory: RSS growth {disk / mem:.2f}, seconds {disk_s / mem_s:.2f}")
