"""YSB over Kafka: flowkit against a hand-written aiokafka loop, same topic, same run.

    python -m benchmarks.ysb_kafka [--events 400000] [--repeat 2] [--bootstrap HOST:PORT]
    python -m benchmarks.ysb_kafka --broker apache-kafka    # on Apache Kafka (Java, Maven)
    python -m benchmarks.ysb_kafka --broker apache-kafka --exactly-once --skip-processes

Starts a Tansu broker, or Apache Kafka with ``--broker apache-kafka`` (unless
``--bootstrap`` names a running Kafka; benchmarks/kafka_broker.py), pre-loads ``--events``
YSB events (about 250 bytes of JSON each, keyed by user, event times in the past) into the
4-partition topic ``ysb-events``, then reads the whole topic with each of:

* raw consume: aiokafka ``getmany`` and nothing else (the ceiling);
* hand-written: ``getmany`` -> msgspec decode into the projected struct -> ``if view`` ->
  ``ads[ad_id]`` -> ``counts[campaign, window] += 1``;
* flowkit: ``examples/ysb.py`` (filter, global-table join, two-phase windowed count) run by
  an in-process ``flowkit.Worker`` over ``KafkaTransport`` until every event is processed
  and nothing is in flight (as benchmarks/ysb.py does on the memory broker);
* with ``--exactly-once``: flowkit again with ``processing_guarantee="exactly_once"`` in
  each round, its outputs read ``read_committed`` (the cost of exactly-once, paired with
  at-least-once in the same round; needs a broker that runs transactions: Apache Kafka);
* flowkit scale-out: the same app in one worker process, then in two worker processes of
  one group, until the last one has processed its partitions to the end.

Every clock starts when its consumer hands over the first records (so group joins, table
recovery and process start-up are not timed, and each side had one fetch in advance).

Every flowkit run uses a consumer group of its own and fresh internal topics, and its
emitted window counts are checked against the hand-written loop's. All consumers use the
same fetch settings (flowkit's Kafka defaults) and the same ``--max-records`` per fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys
import time
import uuid
from collections import Counter
from typing import Any

import aiokafka
import msgspec
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import flowkit
from benchmarks.kafka_broker import add_broker_options, kafka_broker
from benchmarks.ysb import Seconds
from examples import ysb
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.windows import WindowResult

EVENTS = "ysb-events"
OUTPUT = "ysb-window-counts"
KEEP = {EVENTS, "ysb-campaigns"}  # the input and the global table survive between runs
RATE = 100_000  # events per second of event time
WINDOW_MS = int(ysb.WINDOW_SECONDS * 1000)
# Short group timeouts: a join takes about session_timeout / 2 on Tansu.
GROUP_SETTINGS = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400}
# flowkit's Kafka consumer defaults, given to the aiokafka loops too.
FETCH = {"fetch_max_wait_ms": 50, "max_partition_fetch_bytes": 4 * 1024 * 1024}

Counts = Counter[tuple[str, int]]


SKIP_PROCESSES = False
EXACTLY_ONCE = False  # --exactly-once: flowkit also runs with transactions, in each round
CLIENT = "aiokafka"  # --client: which Kafka client flowkit and the hand-written loops use


def broker_url(bootstrap: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {**GROUP_SETTINGS, "client": CLIENT}.items())
    return f"kafka://{bootstrap}?{query}"


def make_app(name: str = "ysb") -> flowkit.App:
    # The data ends in the past: once caught up and quiet for a second, every partition
    # closes its windows, so the emitted counts can be checked. The name is the group id.
    return ysb.make_app(name=name, generate=False, on_close=None, idle_timeout=1.0)


# -- data -----------------------------------------------------------------------------------


def payloads(n: int) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp) of ``n`` events, ending at least two minutes ago."""
    span_ms = n * 1000 // RATE
    start_ms = int(time.time() * 1000) - span_ms - 120_000
    start_ms -= start_ms % WINDOW_MS
    enc = msgspec.json.Encoder()
    return [
        (user.encode(), enc.encode(event), event.event_time)
        for user, event in ysb.generate_events(n, start_ms=start_ms, per_second=RATE)
    ]


async def preload(bootstrap: str, data: list[tuple[bytes, bytes, int]]) -> float:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(EVENTS, ysb.PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    started = time.perf_counter()
    try:
        # Whole batches per partition (where the default partitioner would put each key):
        # several times faster than a send() per record, which only the loading would feel.
        batches = [producer.create_batch() for _ in range(ysb.PARTITIONS)]
        pending = []
        for key, value, ts in data:
            p = partition_for_key(key, ysb.PARTITIONS)
            if batches[p].append(key=key, value=value, timestamp=ts) is None:
                pending.append(await producer.send_batch(batches[p], EVENTS, partition=p))
                batches[p] = producer.create_batch()
                batches[p].append(key=key, value=value, timestamp=ts)
        for p, batch in enumerate(batches):
            if batch.record_count():
                pending.append(await producer.send_batch(batch, EVENTS, partition=p))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return len(data) / (time.perf_counter() - started)


async def reset_internal_topics(bootstrap: str) -> None:
    """Delete what a flowkit run created (changelog, repartition, output, DLQ)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # Only the benchmark's own topics: --bootstrap may point at a shared broker.
        doomed = [t for t in await admin.list_topics() if t.startswith("ysb") and t not in KEEP]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


# -- the aiokafka loops -------------------------------------------------------------------


async def _consumer(bootstrap: str) -> Any:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **FETCH
    )
    await consumer.start()
    tps = [aiokafka.TopicPartition(EVENTS, p) for p in range(ysb.PARTITIONS)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return consumer


async def raw_consume(bootstrap: str, n: int, max_records: int) -> float:
    consumer = await _consumer(bootstrap)
    try:
        seen, started = 0, 0.0
        while seen < n:
            batches = await consumer.getmany(timeout_ms=1000, max_records=max_records)
            if not seen and batches:
                started = time.perf_counter()  # every loop's clock starts at its first record
            for records in batches.values():
                seen += len(records)
        return time.perf_counter() - started
    finally:
        await consumer.stop()


async def hand_written(bootstrap: str, n: int, max_records: int) -> tuple[float, Counts]:
    decode = msgspec.json.Decoder(ysb.AdView).decode
    ads = ysb.campaign_map()
    counts: Counts = Counter()
    consumer = await _consumer(bootstrap)
    try:
        seen, started, cpu = 0, 0.0, 0.0
        while seen < n:
            batches = await consumer.getmany(timeout_ms=1000, max_records=max_records)
            if not seen and batches:
                started, cpu = time.perf_counter(), time.process_time()
            for records in batches.values():
                seen += len(records)
                for record in records:
                    view = decode(record.value)
                    if view.event_type == "view":
                        t = view.event_time
                        counts[ads[view.ad_id], t - t % WINDOW_MS] += 1
        return Seconds(time.perf_counter() - started, time.process_time() - cpu), counts
    finally:
        await consumer.stop()


# -- the confluent-kafka (librdkafka) loops, for --client rdkafka ------------------------------
# Plain blocking loops, as a user of confluent-kafka would write them: nothing else runs
# in the process meanwhile. Same fetch settings as flowkit's rdkafka defaults.


def _rd_consumer(bootstrap: str) -> Any:
    import confluent_kafka as ck

    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ysb-hand-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": FETCH["fetch_max_wait_ms"],
            "max.partition.fetch.bytes": FETCH["max_partition_fetch_bytes"],
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign(
        [ck.TopicPartition(EVENTS, p, ck.OFFSET_BEGINNING) for p in range(ysb.PARTITIONS)]
    )
    return consumer


def _rd_loop(bootstrap: str, n: int, max_records: int, query: bool) -> tuple[float, Counts]:
    decode = msgspec.json.Decoder(ysb.AdView).decode
    ads = ysb.campaign_map()
    counts: Counts = Counter()
    consumer = _rd_consumer(bootstrap)
    try:
        seen, started, cpu = 0, 0.0, 0.0
        while seen < n:
            records = consumer.consume(max_records, 0) or consumer.consume(1, 1.0)
            if not seen and records:
                started, cpu = time.perf_counter(), time.process_time()
            seen += len(records)
            if query:
                for record in records:
                    view = decode(record.value())
                    if view.event_type == "view":
                        t = view.event_time
                        counts[ads[view.ad_id], t - t % WINDOW_MS] += 1
        return Seconds(time.perf_counter() - started, time.process_time() - cpu), counts
    finally:
        consumer.close()


async def window_counts(bootstrap: str, expected: int, deadline: float = 60.0) -> Counts:
    """Read the output topic until ``expected`` results arrived (or the deadline); only
    what committed transactions wrote (what at-least-once writes is all committed)."""
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **FETCH,
    )
    await consumer.start()
    decode = msgspec.json.Decoder(WindowResult).decode
    got: Counts = Counter()
    seen = 0
    try:
        consumer.assign([aiokafka.TopicPartition(OUTPUT, p) for p in range(ysb.PARTITIONS)])
        end = time.monotonic() + deadline
        while seen < expected and time.monotonic() < end:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    r = decode(record.value)
                    got[str(r.key), r.start] += int(r.value)
                    seen += 1
        await asyncio.sleep(0.5)  # a duplicate emission would show up now
        for records in (await consumer.getmany(timeout_ms=200)).values():
            seen += len(records)
    finally:
        await consumer.stop()
    if seen != expected:
        raise SystemExit(f"flowkit emitted {seen} window counts, expected {expected}")
    return got


# -- flowkit in this process --------------------------------------------------------------


async def flowkit_in_process(
    bootstrap: str, n: int, max_records: int, expected: int, exactly_once: bool = False
) -> tuple[float, Counts]:
    await reset_internal_topics(bootstrap)
    worker = flowkit.Worker(
        make_app(name=f"ysb-bench-{uuid.uuid4().hex[:8]}"),
        broker=broker_url(bootstrap),
        max_fetch_records=max_records,
        processing_guarantee="exactly_once" if exactly_once else None,
    )
    async with worker:
        await _until(worker, lambda: worker.records_in > 0, 60)
        start = time.perf_counter()
        await _until(worker, lambda: _done(worker, n), 600)
        elapsed = time.perf_counter() - start
        counts = await window_counts(bootstrap, expected)
    return elapsed, counts


async def _until(worker: flowkit.Worker, condition: Any, deadline: float) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if worker.error is not None or worker.stopping:
            raise SystemExit(f"the flowkit worker stopped: {worker.error!r}")
        if time.monotonic() > end:
            raise SystemExit(f"the flowkit worker did not finish in {deadline} s")
        await asyncio.sleep(0.002)


def _done(worker: flowkit.Worker, n: int | None) -> bool:
    # Every event read and nothing left in flight on this worker's partitions.
    if n is not None and worker.records_in < n:
        return False
    return worker.records_in > 0 and worker.is_idle()


# -- flowkit worker processes -------------------------------------------------------------


async def child(bootstrap: str, group: str, max_records: int) -> None:
    """One worker process: reports its first record and "done" as JSON lines; runs
    until SIGTERM."""
    worker = flowkit.Worker(
        make_app(name=group), broker=broker_url(bootstrap), max_fetch_records=max_records
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    def report(**fields: Any) -> None:
        assignment = worker.assignment
        assignments = assignment.assignments if assignment is not None else 0
        print(json.dumps({**fields, "assignments": assignments}), flush=True)

    async with worker:
        await _until(worker, lambda: worker.records_in > 0, 60)
        report(first=time.time(), cpu=time.process_time())
        await _until(worker, lambda: _done(worker, None), 600)
        report(done=time.time(), cpu=time.process_time(), records=worker.records_in)
        await stop.wait()


async def flowkit_processes(
    bootstrap: str, processes: int, max_records: int, expected: int, n: int
) -> tuple[float, Counts, bool, float]:
    """Run ``processes`` worker processes in one group.

    Returns (seconds, window counts, whether the group rebalanced mid-run, the mean share
    of a core each process used).
    """
    await reset_internal_topics(bootstrap)
    group = f"ysb-bench-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "benchmarks.ysb_kafka", "--child", "--bootstrap", bootstrap]
    cmd += ["--group", group, "--max-records", str(max_records), "--client", CLIENT]
    procs = [
        await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
        for _ in range(processes)
    ]
    try:
        first, done = [], []
        for proc in procs:
            assert proc.stdout is not None
            first.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)))
        for proc in procs:
            assert proc.stdout is not None
            done.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 600)))
        counts = await window_counts(bootstrap, expected)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    start = min(f["first"] for f in first)
    end = max(d["done"] for d in done)
    rebalanced = any(d["assignments"] > 1 for d in done)
    # The share of a core each process used while it worked (CPU seconds / wall seconds).
    busy = [
        (d["cpu"] - f["cpu"]) / (d["done"] - f["first"]) for f, d in zip(first, done, strict=True)
    ]
    if sum(d["records"] for d in done) < n:
        raise SystemExit(f"the worker processes read {sum(d['records'] for d in done)} of {n}")
    return end - start, counts, rebalanced, sum(busy) / len(busy)


# -- main -----------------------------------------------------------------------------------


async def run(bootstrap: str, events: int, repeat: int, max_records: int) -> None:
    data = payloads(events)
    size = sum(len(v) for _, v, _ in data) / len(data)
    rate = await preload(bootstrap, data)
    del data
    gc.collect()
    print(
        f"{events:,} YSB events of {size:.0f} bytes in {ysb.PARTITIONS} partitions "
        f"(produced at {rate:,.0f}/s); fetch {FETCH}, max_records={max_records}"
    )
    raw = hand = flow = eos = float("inf")
    rounds: list[tuple[float, float]] = []  # (at-least-once, exactly-once) seconds per round
    expected: Counts | None = None
    for _ in range(repeat):
        if CLIENT == "rdkafka":
            raw = min(raw, _rd_loop(bootstrap, events, max_records, query=False)[0])
            t_hand, expected = _rd_loop(bootstrap, events, max_records, query=True)
        else:
            raw = min(raw, await raw_consume(bootstrap, events, max_records))
            t_hand, expected = await hand_written(bootstrap, events, max_records)
        hand = min(hand, t_hand)
        t_flow, got = await flowkit_in_process(bootstrap, events, max_records, len(expected))
        if got != expected:
            raise SystemExit("flowkit's window counts differ from the hand-written loop's")
        flow = min(flow, t_flow)
        if EXACTLY_ONCE:
            t_eos, got = await flowkit_in_process(
                bootstrap, events, max_records, len(expected), exactly_once=True
            )
            if got != expected:
                raise SystemExit("flowkit exactly-once: window counts differ from the loop's")
            eos = min(eos, t_eos)
            rounds.append((t_flow, t_eos))
    assert expected is not None
    print(f"client: {CLIENT}")
    print(f"raw consume (fetch only)   : {events / raw:>10,.0f} events/s")
    print(f"hand-written {CLIENT} loop : {events / hand:>10,.0f} events/s")
    print(f"flowkit Worker, in-process : {events / flow:>10,.0f} events/s")
    print(f"ratio flowkit / hand-written: {hand / flow:.2f}   (counts identical)")
    if EXACTLY_ONCE:
        ratios = sorted(alos / exact for alos, exact in rounds)
        print(f"flowkit exactly-once       : {events / eos:>10,.0f} events/s")
        print(
            f"ratio exactly-once / at-least-once: {flow / eos:.2f} best/best, "
            f"{ratios[len(ratios) // 2]:.2f} median of rounds "
            f"({ratios[0]:.2f}-{ratios[-1]:.2f})   (counts identical)"
        )

    if SKIP_PROCESSES:
        return
    best: dict[int, float] = {}
    for processes in (1, 2):
        measured: list[tuple[float, float]] = []
        spoiled = 0
        while len(measured) < repeat and spoiled < 3:
            seconds, got, rebalanced, cpu = await flowkit_processes(
                bootstrap, processes, max_records, len(expected), events
            )
            if got != expected:
                raise SystemExit(f"{processes} worker processes: window counts differ")
            if rebalanced:  # a member joined late: part of the run had fewer workers
                spoiled += 1
                print(f"  ({processes} processes: the group rebalanced mid-run; not counted)")
            else:
                measured.append((seconds, cpu))
        if not measured:
            raise SystemExit(f"{processes} worker processes: every run was spoiled")
        best[processes], cpu = min(measured)
        rate = events / best[processes]
        plural = "es" if processes > 1 else "  "
        print(
            f"flowkit, {processes} worker process{plural}: {rate:>10,.0f} events/s"
            f"   (each process busy {cpu:.0%} of a core)"
        )
    print(f"scale-out ratio 2 / 1 processes: {best[1] / best[2]:.2f}   (counts identical)")


def main() -> None:
    parser = argparse.ArgumentParser(description="YSB over Kafka: flowkit vs hand-written")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the best counts")
    parser.add_argument("--max-records", type=int, default=2000, help="records per getmany")
    add_broker_options(parser)
    parser.add_argument("--client", choices=["aiokafka", "rdkafka"], default="aiokafka")
    parser.add_argument("--skip-processes", action="store_true", help="no scale-out runs")
    parser.add_argument(
        "--exactly-once",
        action="store_true",
        help="also run flowkit with processing_guarantee='exactly_once' in each round "
        "(needs a broker that runs transactions: --broker apache-kafka)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global CLIENT, SKIP_PROCESSES, EXACTLY_ONCE
    CLIENT, SKIP_PROCESSES = args.client, args.skip_processes
    EXACTLY_ONCE = args.exactly_once
    configure_logging("warning")
    if args.child:
        asyncio.run(child(args.bootstrap, args.group, args.max_records))
        return
    with kafka_broker(args.bootstrap, args.broker) as (bootstrap, _):
        asyncio.run(run(bootstrap, args.events, args.repeat, args.max_records))


if __name__ == "__main__":
    main()
