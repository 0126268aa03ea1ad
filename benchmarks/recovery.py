"""Table recovery from a changelog: a flowkit worker against a hand-written reader.

    python -m benchmarks.recovery [--records 1000000] [--repeat 3]            # memory broker
    python -m benchmarks.recovery --kafka [--records 1000000] [--repeat 2]    # Kafka, both clients
    (--broker apache-kafka: on Apache Kafka instead of Tansu; --bootstrap: on a running Kafka)

A table of ``--records`` distinct small keys (``user-0000042`` -> an int) is written
straight into its compacted changelog (4 partitions), then, in paired rounds:

* hand-written: a group-less consumer reads the changelog to its end and decodes every
  record into one dict per partition (what any recovery has to do);
* flowkit: a ``Worker`` of the app that owns the table starts, is assigned the partitions
  and recovers them; timed by the worker's own recovery progress (from the first fetch of
  the changelog to the last record applied), so group joins are not counted.

On Kafka each round also reads the changelog with aiokafka alone (``getmany`` to the end,
nothing applied: what the client's own records cost) and runs the worker on both clients.
Every contender is reported in wall-clock and in CPU time, with the broker's CPU time while it
read (from ``/proc``, when the script started the broker): a broker that is not the limit
uses a small fraction of what the reader uses.

On a terminal the worker draws its recovery progress bar on stderr while it reads.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import msgspec

import flowkit
from benchmarks.kafka_broker import add_broker_options, kafka_broker
from benchmarks.rounds import report
from flowkit.logs import configure_logging
from flowkit.records import TopicPartition
from flowkit.runtime.tables.recovery import RecoveryProgress
from flowkit.transports import MemoryBroker, MemoryTransport, read_to_end

APP = "recovery-bench"
PARTITIONS = 4


def make_app() -> tuple[flowkit.App, Any]:
    """The app that owns the table (an agent that writes it, so its partitions are held)."""
    app = flowkit.App(APP, partitions=PARTITIONS)
    updates = app.topic(f"{APP}-updates", value_type=int)
    totals = app.table("totals", default=int, value_type=int)

    @app.agent(updates)
    async def add(stream: flowkit.Stream[int]) -> None:
        async for amount in stream:
            totals["all"] += amount

    return app, totals


def changelog(table: Any, n: int) -> list[list[tuple[bytes, bytes]]]:
    """The encoded changelog records of ``n`` keys, per partition."""
    out: list[list[tuple[bytes, bytes]]] = [[] for _ in range(table.partitions)]
    encode = table.value_codec.encode
    for i in range(n):
        key = f"user-{i:07d}"
        out[table.partition_of(key)].append((table.encode_key(key), encode(i)))
    return out


# -- timing ------------------------------------------------------------------------------


class RecoveryTimer:
    """Listens to a worker's recovery progress: seconds and records of its recoveries."""

    def __init__(self) -> None:
        self.records = 0
        self.seconds = 0.0
        self.cpu = 0.0  # CPU seconds of this process, from its first changelog batch
        self._cpu_start: float | None = None

    def __call__(self, recovery: RecoveryProgress) -> None:
        if recovery.active and self._cpu_start is None:
            # After the first batch: its CPU time is added back pro rata at the end.
            self._cpu_start, self._first = time.process_time(), recovery.read
        if not recovery.active and recovery.read:
            self.records += recovery.read
            self.seconds += time.monotonic() - recovery.started
            if self._cpu_start is not None:
                cpu = time.process_time() - self._cpu_start
                self.cpu += cpu * recovery.read / max(recovery.read - self._first, 1)
            self._cpu_start = None


async def with_flowkit(n: int, **worker: Any) -> tuple[float, float, int]:
    """Start a worker, wait until it recovered ``n`` records; (seconds, CPU seconds,
    table size)."""
    app, totals = make_app()
    w = flowkit.Worker(app, **worker)
    timer = RecoveryTimer()
    w.state.recovery.listeners.append(timer)
    async with w:
        deadline = time.monotonic() + 600
        while timer.records < n:
            if w.error is not None:
                raise SystemExit(f"the worker stopped: {w.error!r}")
            if time.monotonic() > deadline:
                raise SystemExit(f"recovered {timer.records:,} of {n:,} records in 600 s")
            await asyncio.sleep(0.005)
        size = len(w.state.stores[totals])
    return timer.seconds, timer.cpu, size


def hand_loop(table: Any) -> tuple[dict[int, dict[Any, Any]], Any]:
    """The dicts a hand-written recovery fills, and the ``apply`` that fills them (with
    msgspec's and ``bytes.decode`` directly: the table's keys are text, its values ints)."""
    data: dict[int, dict[Any, Any]] = {}
    decode = msgspec.json.Decoder(int).decode
    decode_key = bytes.decode

    def apply(tp: TopicPartition, messages: list[Any]) -> None:
        d = data.setdefault(tp.partition, {})
        for m in messages:
            d[decode_key(m.key)] = decode(m.value)

    return data, apply


# -- memory broker -----------------------------------------------------------------------


def memory_broker(table: Any, n: int) -> MemoryBroker:
    broker = MemoryBroker(retention_records=None)
    broker.create_topic(table.changelog_topic, table.partitions, compacted=True)
    for p, records in enumerate(changelog(table, n)):
        for key, value in records:
            broker.append(table.changelog_topic, value, key=key, partition=p)
    return broker


async def hand_memory(broker: MemoryBroker, table: Any) -> tuple[float, float, int]:
    consumer = MemoryTransport(broker).consumer(group_id=None)
    tps = [TopicPartition(table.changelog_topic, p) for p in range(table.partitions)]
    consumer.assign(tps)
    data, apply = hand_loop(table)
    start, cpu = time.perf_counter(), time.process_time()
    await read_to_end(consumer, tps, apply)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await consumer.aclose()
    return elapsed, cpu, sum(len(d) for d in data.values())


def run_memory(n: int, repeat: int) -> None:
    _, table = make_app()
    broker = memory_broker(table, n)
    print(f"memory broker: a changelog of {n:,} keys in {table.partitions} partitions")
    rounds, cpu_rounds = [], []
    for _ in range(repeat):
        gc.collect()
        t_hand, c_hand, size_hand = asyncio.run(hand_memory(broker, table))
        gc.collect()
        t_flow, c_flow, size = asyncio.run(with_flowkit(n, transport=MemoryTransport(broker)))
        if size != n or size_hand != n:
            raise SystemExit(f"recovered {size:,} (hand-written {size_hand:,}) of {n:,} keys")
        rounds.append({"hand-written": t_hand, "flowkit": t_flow})
        cpu_rounds.append({"hand-written (CPU time)": c_hand, "flowkit (CPU time)": c_flow})
    ratio = [("flowkit / hand-written", "flowkit", "hand-written")]
    report(rounds, n, "record", ratio)
    print("the same, records per second of CPU time (what an idle core would do):")
    cpu_ratio = [("flowkit / hand-written", "flowkit (CPU time)", "hand-written (CPU time)")]
    report(cpu_rounds, n, "record", cpu_ratio)


# -- Kafka -----------------------------------------------------------------------------


async def preload_kafka(bootstrap: str, table: Any, n: int) -> None:
    import aiokafka
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topic = NewTopic(
            table.changelog_topic,
            table.partitions,
            1,
            topic_configs={"cleanup.policy": "compact"},
        )
        await admin.create_topics([topic])
    finally:
        await admin.close()
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=1 << 20)
    await producer.start()
    try:
        pending = []
        for p, records in enumerate(changelog(table, n)):
            batch = producer.create_batch()
            for key, value in records:
                if batch.append(key=key, value=value, timestamp=None) is None:
                    pending.append(
                        await producer.send_batch(batch, table.changelog_topic, partition=p)
                    )
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)
            pending.append(await producer.send_batch(batch, table.changelog_topic, partition=p))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def hand_kafka(bootstrap: str, table: Any, *, apply: bool = True) -> tuple[float, float, int]:
    """Read the changelog with aiokafka alone, to the end; (seconds, CPU seconds, records or
    keys). With ``apply`` it fills one dict per partition (a hand-written recovery);
    without, it only counts what ``getmany`` returns (the client's own ceiling)."""
    import aiokafka

    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    tps = [aiokafka.TopicPartition(table.changelog_topic, p) for p in range(table.partitions)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    data, fill = hand_loop(table)
    n = 0
    try:
        # The same stop rule as flowkit's: each partition's position reaches the high
        # watermark its fetches report.
        remaining = set(tps)
        start, cpu = time.perf_counter(), time.process_time()  # from the first fetch
        while remaining:
            batches = await consumer.getmany(timeout_ms=50, max_records=50_000)
            for tp, records in batches.items():
                if apply:
                    fill(TopicPartition(tp.topic, tp.partition), records)
                n += len(records)
            for tp in list(remaining):
                high = consumer.highwater(tp)
                if high is not None and await consumer.position(tp) >= high:
                    remaining.discard(tp)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        return elapsed, cpu, sum(len(d) for d in data.values()) if apply else n
    finally:
        await consumer.stop()


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far; 0.0 when it is
    unknown or not readable (a broker this script did not start, not Linux)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kafka_round(
    runs: dict[str, Callable[[], Coroutine[Any, Any, tuple[float, float, int]]]],
    n: int,
    pid: int | None,
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """One paired round: seconds, CPU seconds and the broker's CPU seconds per contender."""
    seconds: dict[str, float] = {}
    cpus: dict[str, float] = {}
    brokers: dict[str, float] = {}
    for label, run in runs.items():
        gc.collect()
        before = process_cpu(pid)
        seconds[label], cpus[label], got = asyncio.run(run())
        brokers[label] = process_cpu(pid) - before
        if got != n:
            raise SystemExit(f"{label}: read {got:,} of {n:,} records")
    return seconds, cpus, brokers


def run_kafka(n: int, repeat: int, bootstrap: str | None, broker: str = "tansu") -> None:
    with kafka_broker(bootstrap, broker) as (address, pid):
        _, table = make_app()
        started, cpu, broker_cpu = time.perf_counter(), time.process_time(), process_cpu(pid)
        asyncio.run(preload_kafka(address, table, n))
        print(
            f"Kafka ({broker}): a changelog of {n:,} keys in {table.partitions} partitions, loaded"
            f" in {time.perf_counter() - started:.1f} s (loader CPU"
            f" {time.process_time() - cpu:.1f} s, broker CPU"
            f" {process_cpu(pid) - broker_cpu:.1f} s)"
        )
        clients = ("aiokafka", "rdkafka")
        rounds: list[dict[str, float]] = []
        cpu_rounds: list[dict[str, float]] = []
        broker_rounds: list[dict[str, float]] = []
        query = "session_timeout_ms=2000&heartbeat_interval_ms=400"
        for _ in range(repeat):
            runs: dict[str, Callable[[], Coroutine[Any, Any, tuple[float, float, int]]]] = {
                "aiokafka getmany alone": lambda: hand_kafka(address, table, apply=False),
                "aiokafka hand-written": lambda: hand_kafka(address, table),
            }
            for client in clients:
                url = f"kafka://{address}?{query}&client={client}"
                runs[f"flowkit {client}"] = partial(with_flowkit, n, broker=url)
            seconds, cpus, brokers = kafka_round(runs, n, pid)
            rounds.append(seconds)
            cpu_rounds.append(cpus)
            broker_rounds.append(brokers)
        ratios = [
            (
                "aiokafka hand-written / getmany alone",
                "aiokafka hand-written",
                "aiokafka getmany alone",
            ),
            *(
                (f"flowkit {c} / aiokafka hand-written", f"flowkit {c}", "aiokafka hand-written")
                for c in clients
            ),
        ]
        report(rounds, n, "record", ratios)
        print("the same, records per second of this process's CPU time:")
        report(cpu_rounds, n, "record", ratios)
        if pid is not None:
            print("the broker's CPU time while each read (median of rounds), and its share of")
            print("the reader's CPU time:")
            for label in rounds[0]:
                b = statistics.median(r[label] for r in broker_rounds)
                c = statistics.median(r[label] for r in cpu_rounds)
                print(f"  {label:<24}: broker {b:5.2f} s, {b / c:4.0%} of the reader's {c:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description="table recovery from a changelog")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kafka", action="store_true", help="on Kafka, both clients")
    add_broker_options(parser)  # --bootstrap, --broker tansu|apache-kafka (with --kafka)
    args = parser.parse_args()
    configure_logging("warning")
    if args.kafka:
        run_kafka(args.records, args.repeat, args.bootstrap, args.broker)
    else:
        run_memory(args.records, args.repeat)


if __name__ == "__main__":
    main()
