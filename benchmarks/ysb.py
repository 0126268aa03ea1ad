"""The Yahoo Streaming Benchmark: flowkit vs a hand-written loop, same data, same process.

    python -m benchmarks.ysb [--events 1000000] [--repeat 5]
    python -m benchmarks.ysb --memory          # peak memory at N and 10 N events
    python -m benchmarks.ysb --instructions --events 50000   # callgrind instruction counts
    python -m benchmarks.ysb --cache --events 50000    # simulated cache and branch misses

Both sides read the same pre-encoded events (about 250 bytes of JSON each):

* hand-written: ``for data in payloads``: decode into the projected struct, ``if view``,
  ``campaign = ads[ad_id]``, ``counts[campaign, window] += 1``;
* flowkit: ``examples/ysb.py`` (filter, global-table join, two-phase windowed count) run
  by a worker over the events pre-loaded into a 4-partition topic on the memory broker,
  timed until every event is processed; then its emitted window counts are checked
  against the hand-written ones;
* per-record: the same, with the query written as a per-record agent
  (``make_app(per_record=True)``: a plain function the stream's loop calls per event),
  in the same rounds, its counts checked the same way.

``--stores`` runs flowkit with its windowed table on ``rocksdb://`` against ``memory://``
in paired rounds, its window counts identical on both.

``--memory`` runs flowkit alone in a subprocess per size, producing events while the
worker consumes them (broker retention on), and prints the peak RSS for N and 10 N.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

import msgspec

import flowkit
from benchmarks import cachegrind
from benchmarks.cachegrind import measured
from benchmarks.callgrind import compare
from benchmarks.rounds import against_hand_written
from examples import ysb
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker, MemoryTransport, TopicSpec

START_MS = 1_700_000_000_000


class Seconds(float):
    """Wall-clock seconds (the float), with the CPU seconds of the process beside them:
    on a machine shared by many processes, CPU time is the steadier yardstick."""

    cpu: float

    def __new__(cls, wall: float, cpu: float) -> Seconds:
        self = super().__new__(cls, wall)
        self.cpu = cpu
        return self


#: The second flowkit contender: the same query as a per-record agent (--part, label).
FORMS = [("flowkit-record", "per-record")]

RATE = 100_000  # events per second of event time: 10 s windows of 1 M events hold 10 windows


def payloads(n: int) -> list[tuple[bytes, bytes]]:
    enc = msgspec.json.Encoder()
    return [
        (user.encode(), enc.encode(event))
        for user, event in ysb.generate_events(n, start_ms=START_MS, per_second=RATE)
    ]


def hand_written(data: list[tuple[bytes, bytes]]) -> tuple[Seconds, Counter[tuple[str, int]]]:
    decode = msgspec.json.Decoder(ysb.AdView).decode
    ads = ysb.campaign_map()
    counts: Counter[tuple[str, int]] = Counter()
    start, cpu = time.perf_counter(), time.process_time()
    with measured():
        for _, raw in data:
            view = decode(raw)
            if view.event_type == "view":
                t = view.event_time
                counts[ads[view.ad_id], t - t % 10_000] += 1
    return Seconds(time.perf_counter() - start, time.process_time() - cpu), counts


def hand_written_over_logs(broker: MemoryBroker) -> Seconds:
    """The same loop over the events as the broker stores them (what a consumer reads)."""
    decode = msgspec.json.Decoder(ysb.AdView).decode
    ads = ysb.campaign_map()
    counts: Counter[tuple[str, int]] = Counter()
    start, cpu = time.perf_counter(), time.process_time()
    for partition in range(ysb.PARTITIONS):
        for message in broker.messages("ysb-events", partition):
            view = decode(message.value)  # type: ignore[arg-type]
            if view.event_type == "view":
                t = view.event_time
                counts[ads[view.ad_id], t - t % 10_000] += 1
    return Seconds(time.perf_counter() - start, time.process_time() - cpu)


async def loaded_broker(data: list[tuple[bytes, bytes]]) -> MemoryBroker:
    """A memory broker with the events in a 4-partition topic, keyed by user.

    Loaded one partition after the other (each partition's events in their order), each
    value copied: a partition's records sit together in memory, as in a broker's log files
    and in what a Kafka consumer fetches. Sending the producer's own bytes objects in data
    order would interleave the partitions record by record."""
    broker = MemoryBroker(retention_records=None)
    producer = MemoryTransport(broker).producer()
    broker.create_topic("ysb-events", ysb.PARTITIONS)
    by_partition: list[list[tuple[bytes, bytes]]] = [[] for _ in range(ysb.PARTITIONS)]
    partition_of: dict[bytes, int] = {}
    for key, raw in data:
        p = partition_of.get(key)
        if p is None:
            p = partition_of[key] = partition_for_key(key, ysb.PARTITIONS)
        by_partition[p].append((key, raw))
    for records in by_partition:
        for key, raw in records:
            # The broker's own copy, as a consumer receives records from Kafka: fresh
            # bytes, a partition's records together, not the producer's objects.
            await producer.send("ysb-events", bytes(memoryview(raw)), key=key)
    return broker


async def with_flowkit(
    data: list[tuple[bytes, bytes]], per_record: bool = False, data_dir: str | None = None
) -> tuple[Seconds, Counter[tuple[str, int]], Seconds]:
    broker = await loaded_broker(data)
    transport = MemoryTransport(broker)
    clock = FakeClock(START_MS / 1000 + 3600)
    app = ysb.make_app(generate=False, on_close=None, per_record=per_record)
    if data_dir is not None:  # the windowed table on rocksdb:// (--stores)
        app.store = "rocksdb://"
    worker = flowkit.Worker(app, transport=transport, clock=clock, data_dir=data_dir)
    total = len(data)
    async with worker:
        start, cpu = time.perf_counter(), time.process_time()
        while worker.records_in < total or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        elapsed = Seconds(time.perf_counter() - start, time.process_time() - cpu)
        await clock.advance(40)  # the data ended: quiet partitions close the last windows
        await clock.advance(40)
        while not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.002)
    reader = transport.consumer(group_id=None)
    counts: Counter[tuple[str, int]] = Counter()
    from flowkit.records import TopicPartition
    from flowkit.transports import read_to_end

    out = app.topics["ysb-window-counts"]
    tps = {TopicPartition(out.name, p) for p in range(out.partitions)}
    reader.assign(tps)

    def add(_: TopicPartition, messages: list[flowkit.Message]) -> None:
        for m in messages:
            r = out.decode(m.value)  # type: ignore[arg-type]
            counts[r.key, r.start] += r.value

    await read_to_end(reader, tps, add)
    gc.collect()
    return elapsed, counts, hand_written_over_logs(broker)


def stores(n: int, rounds: int) -> None:
    """The windowed table on ``rocksdb://`` against ``memory://``: events a second (wall
    and CPU) in paired rounds, the window counts identical in each."""
    data = payloads(n)
    print(f"{n:,} YSB events; events/s, memory:// then rocksdb:// (wall, CPU)")
    ratios = []
    for r in range(rounds):
        memory, want, _ = asyncio.run(with_flowkit(data))
        with tempfile.TemporaryDirectory() as data_dir:
            disk, got, _ = asyncio.run(with_flowkit(data, data_dir=data_dir))
        if got != want:
            raise SystemExit("the window counts on rocksdb:// differ from memory://")
        ratio = (float(memory) / float(disk), memory.cpu / disk.cpu)
        ratios.append(ratio)
        print(
            f"round {r + 1}: {n / float(memory):,.0f} / {n / memory.cpu:,.0f}, "
            f"{n / float(disk):,.0f} / {n / disk.cpu:,.0f}: rocksdb / memory "
            f"{ratio[0]:.2f} wall, {ratio[1]:.2f} CPU"
        )
    wall = statistics.median(w for w, _ in ratios)
    cpu = statistics.median(c for _, c in ratios)
    print(f"median rocksdb / memory: {wall:.2f} wall, {cpu:.2f} CPU; counts identical")


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


async def memory_run(n: int) -> list[float]:
    """Produce n events while a worker consumes them; RSS (MiB) at each tenth of the run."""
    broker = MemoryBroker(retention_records=20_000)
    samples: list[float] = []
    transport = MemoryTransport(broker)
    await transport.create_topics([TopicSpec("ysb-events", ysb.PARTITIONS)])
    producer = transport.producer()
    app = ysb.make_app(generate=False, on_close=None)
    clock = FakeClock(START_MS / 1000 + 3600)
    enc = msgspec.json.Encoder()
    worker = flowkit.Worker(app, transport=transport, clock=clock, commit_interval=0.05)
    async with worker:
        for i, (user, event) in enumerate(
            ysb.generate_events(n, start_ms=START_MS, per_second=RATE)
        ):
            await producer.send("ysb-events", enc.encode(event), key=user.encode())
            if i % 10_000 == 0:
                while worker.records_in < i - 10_000:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
                await clock.advance(0.05)  # commits, so retention can drop consumed records
            if (i + 1) % (n // 10) == 0:
                samples.append(_rss_mib())
    return samples


async def _load_and_maybe_run(
    data: list[tuple[bytes, bytes]], run: bool, per_record: bool = False
) -> None:
    transport = MemoryTransport(await loaded_broker(data))
    if run:
        clock = FakeClock(START_MS / 1000 + 3600)
        app = ysb.make_app(generate=False, on_close=None, per_record=per_record)
        worker = flowkit.Worker(app, transport=transport, clock=clock)
        async with worker:
            with measured():  # the same wait as with_flowkit's timed one
                while worker.records_in < len(data) or not worker.is_idle():  # noqa: ASYNC110
                    await asyncio.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description="YSB: flowkit vs a hand-written loop")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="peak RSS at N and 10 N")
    parser.add_argument(
        "--stores",
        action="store_true",
        help="flowkit with its windowed table on rocksdb:// against memory://, paired rounds",
    )
    parser.add_argument("--memory-run", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare instruction counts under valgrind (use --events 50000)",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="simulated cache misses and mispredictions of the timed loops (--events 50000)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="with --cache: keep callgrind's output files in DIR (hand.cg, flowkit.cg)",
    )
    parser.add_argument(
        "--part", choices=["setup", "hand", "flowkit", "flowkit-record"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    configure_logging("warning")
    if args.instructions:
        compare("benchmarks.ysb", "--events", args.events, "event", FORMS)
        return
    if args.cache:
        cachegrind.compare("benchmarks.ysb", "--events", args.events, "event", args.keep, FORMS)
        return
    if args.part:
        data = payloads(args.events)
        run, per_record = args.part.startswith("flowkit"), args.part == "flowkit-record"
        asyncio.run(_load_and_maybe_run(data, run, per_record))
        if args.part == "hand":
            hand_written(data)
        return
    if args.memory_run:
        print(" ".join(f"{mib:.0f}" for mib in asyncio.run(memory_run(args.memory_run))))
        return
    if args.stores:
        stores(args.events, args.repeat)
        return
    if args.memory:
        print("RSS (MiB) after each tenth of the run; the broker keeps 20,000 records a partition")
        peaks = []
        for n in (args.events, args.events * 10):
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.ysb", "--memory-run", str(n)],
                check=True,
                capture_output=True,
                text=True,
            )
            samples = out.stdout.split(chr(10))[-2]
            peaks.append(max(float(mib) for mib in samples.split()))
            print(f"{n:>12,} events: {samples}")
        print(f"peak RSS at 10 N / at N: {peaks[1] / peaks[0]:.3f}")
        return
    data = payloads(args.events)
    size = sum(len(raw) for _, raw in data) / len(data)
    print(f"{args.events:,} YSB events of {size:.0f} bytes, {ysb.PARTITIONS} partitions")
    against_hand_written(
        args.repeat,
        args.events,
        "event",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data)),
        "flowkit's window counts differ from the hand-written loop's",
        [(label, lambda: asyncio.run(with_flowkit(data, per_record=True))) for _, label in FORMS],
    )
    print("window counts: identical to the hand-written loop's in every round, in both forms")


if __name__ == "__main__":
    main()
