"""Session windows: flowkit against a hand-written loop, same data, same process.

    python -m benchmarks.sessions [--clicks 200000] [--repeat 5] [--store both]
    python -m benchmarks.sessions --instructions --clicks 20000    # callgrind counts
    python -m benchmarks.sessions --rss --users 200000 --expires 3600   # each store's RSS

The data: N clicks of 5,000 users, keyed by user on 4 partitions, one every 10 ms of
event time with up to 200 ms of disorder, so a user clicks every 50 s on average, in
bursts; then one click far ahead per partition, which closes every session. The query
counts clicks per user session, with a gap of 60 s and a grace of 10 s (Kafka Streams'
``SessionWindows``): a user's clicks closer than 60 s form one session, a click that
bridges two sessions merges them, and each session's count comes out once, when it closes.

* hand-written: each partition's records in order, decoded with msgspec; per partition a
  dict of each user's sessions ``[start, end, count]`` and a heap of session ends; stream
  time, late records, merges, and a session emitted once stream time passes its end plus
  gap plus grace. The same semantics, written for this data (one partition per key, one
  process);
* flowkit: ``table.session(60.0, grace=10.0, combine=operator.add)`` with ``on_close``,
  run by a worker over the topic pre-loaded on the memory broker (two phases, changelog
  included), timed until every record is processed and the worker has stopped; its
  sessions are compared with the hand-written loop's.

``--store`` chooses the table's store: ``memory`` (the default), ``rocksdb`` (the
``rocksdb`` extra; a fresh data directory each round), or ``both``, in the same paired
rounds with their ratio. ``--rss`` runs flowkit once per store, each in a process of its
own, and prints how much its peak RSS grew over the broker loaded with the data (the
changelog's records dropped as they are written; the repartition topic's kept);
``--users`` and ``--expires`` (how long closed sessions stay readable) set how much state
there is.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import operator
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

import flowkit
from benchmarks.callgrind import compare
from benchmarks.rounds import against_hand_written
from benchmarks.window_keys import forget_changelog
from benchmarks.ysb import Seconds
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.transports import MemoryBroker, MemoryTransport

START_MS = 1_700_000_000_000
PARTITIONS = 4
USERS = 5000
GAP_MS, GRACE_MS = 60_000, 10_000
Data = list[tuple[int, bytes, bytes, int]]  # (partition, key, value, timestamp)
Result = list[tuple[str, int, int, int]]  # (user, start, end, clicks), sorted


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
    for p in range(PARTITIONS):  # far ahead: every session closes
        out.append((p, b"", enc.encode(Click("", end)), end))
    return out


def sessions(records: list[tuple[bytes, int]]) -> Result:
    """The hand-written session count over one partition's (value, timestamp) records."""
    decode = msgspec.json.Decoder(Click).decode
    gap, grace = GAP_MS, GRACE_MS
    by_user: dict[str, list[list[Any]]] = {}
    ends: list[tuple[int, int, str, int]] = []  # (end, n, user, start): a lazy heap
    out: Result = []
    now = -(2**62)
    n = 0
    for raw, _ in records:
        click = decode(raw)
        ts = click.t
        if ts > now:
            now = ts
            close = now - grace - gap
            while ends and ends[0][0] < close:
                _, _, user, start = heapq.heappop(ends)
                own = by_user.get(user)
                if not own:
                    continue
                for k, s in enumerate(own):
                    if s[0] == start:
                        if s[1] >= close:
                            n += 1
                            heapq.heappush(ends, (s[1], n, user, start))
                        else:
                            out.append((user, s[0], s[1], s[2]))
                            del own[k]
                            if not own:
                                del by_user[user]
                        break
        if not click.user:
            continue
        user = click.user
        own = by_user.get(user)
        if own is None:
            if ts < now - grace - gap:
                continue  # late
            by_user[user] = [[ts, ts, 1]]
            n += 1
            heapq.heappush(ends, (ts, n, user, ts))
            continue
        hit = [s for s in own if s[0] - gap <= ts <= s[1] + gap]
        if not hit:
            if ts < now - grace - gap:
                continue  # late
            own.append([ts, ts, 1])
            own.sort()
            n += 1
            heapq.heappush(ends, (ts, n, user, ts))
            continue
        merged = [min(ts, hit[0][0]), max(ts, hit[-1][1]), sum(s[2] for s in hit) + 1]
        if merged[0] != hit[0][0]:
            n += 1
            heapq.heappush(ends, (merged[1], n, user, merged[0]))
        own[own.index(hit[0]) : own.index(hit[-1]) + 1] = [merged]
    return out


def hand_written(data: Data) -> tuple[Seconds, Result]:
    start, cpu = time.perf_counter(), time.process_time()
    parts: list[list[tuple[bytes, int]]] = [[] for _ in range(PARTITIONS)]
    for p, _, raw, ts in data:
        parts[p].append((raw, ts))
    out: Result = []
    for records in parts:
        out.extend(sessions(records))
    return Seconds(time.perf_counter() - start, time.process_time() - cpu), sorted(out)


def hand_written_over_logs(broker: MemoryBroker) -> Seconds:
    start, cpu = time.perf_counter(), time.process_time()
    for p in range(PARTITIONS):
        sessions([(m.value, m.timestamp) for m in broker.messages("clicks", p) if m.value])
    return Seconds(time.perf_counter() - start, time.process_time() - cpu)


def make_app(
    closed: Result, data_dir: Path | None = None, expires: float | None = None
) -> flowkit.App:
    """The query; with ``data_dir``, its table on ``rocksdb://`` there."""
    on_disk: dict[str, Any] = (
        {} if data_dir is None else {"store": "rocksdb://", "data_dir": data_dir}
    )
    app = flowkit.App("sessionbench", partitions=PARTITIONS, **on_disk)
    clicks: flowkit.Topic[Click] = app.topic("clicks", value_type=Click)

    def on_close(user: str, window: flowkit.Window, count: int) -> None:
        closed.append((user, window.start, window.end, count))

    visits = app.table("visits", default=int).session(
        GAP_MS / 1000,
        grace=GRACE_MS / 1000,
        expires=expires,
        combine=operator.add,
        time=lambda c: c.t,
        on_close=on_close,
        late="drop",
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            if click.user:
                visits.add(click.user, 1, click.t)

    return app


async def loaded_broker(data: Data) -> MemoryBroker:
    broker = MemoryBroker(retention_records=None)
    broker.create_topic("clicks", PARTITIONS)
    producer = MemoryTransport(broker).producer()
    for p, key, raw, ts in data:
        await producer.send("clicks", raw, key=key, partition=p, timestamp_ms=ts)
    return broker


async def with_flowkit(
    data: Data, store: str = "memory", expires: float | None = None
) -> tuple[Seconds, Result, Seconds]:
    broker = await loaded_broker(data)
    closed: Result = []
    data_dir = Path(tempfile.mkdtemp(prefix="sessionbench-")) if store == "rocksdb" else None
    try:
        elapsed = await run_worker(make_app(closed, data_dir, expires), broker, len(data))
    finally:
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    return elapsed, sorted(closed), hand_written_over_logs(broker)


async def run_worker(app: flowkit.App, broker: MemoryBroker, n: int) -> Seconds:
    start, cpu = time.perf_counter(), time.process_time()
    worker = flowkit.Worker(app, transport=MemoryTransport(broker))
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < n or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    return Seconds(time.perf_counter() - start, time.process_time() - cpu)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


class _Count(list[Any]):
    """Counts the sessions closed, keeping none (their list is not the worker's state)."""

    n = 0

    def append(self, item: Any) -> None:
        self.n += 1


async def rss_of(data: Data, store: str, expires: float | None) -> None:
    """One run on ``store``: prints the peak RSS's growth over the loaded broker (MB),
    the run's seconds and its sessions (``--part rss``, in a process of its own). The
    changelog's records are dropped as they are written, as in ``window_keys``: Kafka
    keeps them on another machine."""
    broker = await loaded_broker(data)
    before = _rss_mb()
    closed = _Count()
    data_dir = Path(tempfile.mkdtemp(prefix="sessionbench-")) if store == "rocksdb" else None
    app = make_app(closed, data_dir, expires)
    forget_changelog(broker, "sessionbench-visits-changelog")
    try:
        elapsed = await run_worker(app, broker, len(data))
    finally:
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{peak - before:.1f} {float(elapsed):.3f} {closed.n}")


def rss_pair(args: argparse.Namespace) -> None:
    """Each store's peak RSS growth and seconds, each in a process of its own."""
    out = {}
    for store in ("memory", "rocksdb"):
        command = [sys.executable, "-m", "benchmarks.sessions", "--part", "rss"]
        command += ["--store", store, "--clicks", str(args.clicks), "--users", str(args.users)]
        if args.expires is not None:
            command += ["--expires", str(args.expires)]
        grew, wall, sessions_n = subprocess.run(
            command, capture_output=True, text=True, check=True
        ).stdout.split()
        out[store] = float(grew), float(wall)
        print(
            f"  {store:<8} peak RSS +{float(grew):>7,.0f} MB over the loaded broker, "
            f"{float(wall):.2f} s, {int(sessions_n):,} sessions"
        )
    (mem, mem_s), (disk, disk_s) = out["memory"], out["rocksdb"]
    print(f"rocksdb / memory: RSS growth {disk / mem:.2f}, seconds {disk_s / mem_s:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Session windows: flowkit vs by hand")
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", choices=["memory", "rocksdb", "both"], default="memory")
    parser.add_argument("--expires", type=float, default=None, help="seconds (the default's)")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare instruction counts under valgrind (use --clicks 20000)",
    )
    parser.add_argument("--rss", action="store_true", help="each store's peak RSS growth")
    parser.add_argument(
        "--part", choices=["setup", "hand", "flowkit", "rss"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    configure_logging("warning")
    if args.instructions:
        compare("benchmarks.sessions", "--clicks", args.clicks, "click")
        return
    if args.rss:
        print(f"{args.clicks:,} clicks of {args.users:,} users, expires {args.expires} s")
        rss_pair(args)
        return
    data = data_set(args.clicks, args.users)
    if args.part == "rss":
        asyncio.run(rss_of(data, args.store, args.expires))
        return
    if args.part:
        # The broker is loaded in every part, so the differences are the loops alone.
        if args.part == "flowkit":
            asyncio.run(with_flowkit(data, args.store, args.expires))
        else:
            asyncio.run(loaded_broker(data))
            if args.part == "hand":
                hand_written(data)
        return
    _, expected = hand_written(data)
    print(
        f"{args.clicks:,} clicks of {args.users:,} users, {len(expected):,} sessions "
        f"(gap {GAP_MS // 1000} s, grace {GRACE_MS // 1000} s), store {args.store}"
    )
    first = "rocksdb" if args.store == "rocksdb" else "memory"
    others = []
    between = []
    if args.store == "both":
        others = [
            ("flowkit on rocksdb", lambda: asyncio.run(with_flowkit(data, "rocksdb", args.expires)))
        ]
        between = [("rocksdb / memory", "flowkit on rocksdb", "flowkit")]
    against_hand_written(
        args.repeat,
        len(data),
        "record",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data, first, args.expires)),
        "flowkit's sessions differ from the hand-written loop's",
        others,
        between,
    )
    print("sessions: identical to the hand-written loop's in every round")


if __name__ == "__main__":
    main()
