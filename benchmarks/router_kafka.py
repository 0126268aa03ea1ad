"""The router on Kafka: ``examples/router.py`` against a hand-written batched aiokafka loop.

    python -m benchmarks.router_kafka [--orders 200000] [--rounds 3] [--bootstrap HOST:PORT]
    python -m benchmarks.router_kafka --client rdkafka    # both sides on librdkafka
    python -m benchmarks.router_kafka --broker apache-kafka    # on Apache Kafka (Java, Maven)

Starts a Tansu broker, or Apache Kafka with ``--broker apache-kafka`` (unless
``--bootstrap`` names a running Kafka; benchmarks/kafka_broker.py), and pre-loads two
4-partition input topics with the same ``--orders`` orders (about 140 bytes of JSON, keyed
by one of 5,000 customers): a clean one, and one where 2.7 % are bad (2 % lack their
customer, so a transform fails; 0.7 % are not JSON). Each round then routes each input,
once with each of:

* hand-written: aiokafka ``getmany`` -> ``msgspec.json.decode`` -> the three routes'
  filters and transforms written by hand -> one ``create_batch``/``send_batch`` per
  destination partition and fetch (the partition of each key cached), a dead letter with
  its source coordinates for each bad record; acks awaited a fetch behind, then commit;
* flowkit: ``examples/router.py`` (``make_app(demo_traffic=False)``) in a ``flowkit.Worker``
  on ``KafkaTransport``, flowkit's Kafka defaults, until every order is processed and
  every output acknowledged.

With ``--client rdkafka`` both sides use librdkafka (confluent-kafka): the hand-written loop
``consume``s up to ``--max-records``, ``produce``s each output to its key's partition
(murmur2, as flowkit places it), and commits a fetch's offsets once everything it caused is
delivered, a fetch behind; flowkit runs on ``kafka://...?client=rdkafka``.

Both use the same fetch settings and ``--max-records`` per fetch, and both clocks start
when the first records arrive. Every run writes to topics of its own; they are read
back and compared (topic, key and decoded value of every output, and the number of
dead letters): a difference stops the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import random
import time
import uuid
from collections import Counter
from typing import Any

import aiokafka
import msgspec
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import flowkit
from benchmarks.kafka_broker import add_broker_options, kafka_broker
from benchmarks.rounds import report
from examples import router
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key

PARTITIONS = 4
CLIENT = ["aiokafka"]  # --client: the Kafka client of both sides
BOOTSTRAP = [""]  # the broker's address, for the blocking rdkafka loop
GROUP_SETTINGS = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400}
FETCH = {"fetch_max_wait_ms": 50, "max_partition_fetch_bytes": 4 * 1024 * 1024}
PRODUCE = {"acks": "all", "linger_ms": 5, "max_batch_size": 256 * 1024}
EU = frozenset(["NL", "BE", "DE", "FR"])
ROUTE_TOPICS = sorted({t for r in router.ROUTES for t in r["to"]})

Outputs = Counter[tuple[str, bytes | None, bytes]]


# -- data -----------------------------------------------------------------------------------


def orders(n: int, *, bad: bool) -> list[tuple[bytes, bytes]]:
    """(key, value) of ``n`` orders; with ``bad``, 2 % lack a customer and 0.7 % are not
    JSON (the same orders otherwise)."""
    rng, junk = random.Random(7), random.Random(8)
    enc = msgspec.json.Encoder()
    out = []
    for i in range(n):
        order = router.sample_order(rng, i)
        if not bad and "customer" not in order:
            order["customer"] = {"id": "c0", "email": "x@example.com", "country": "NL"}
            order["customer"]["test"] = False
        value = enc.encode(order)
        if bad and junk.random() < 0.007:
            value = value[: len(value) // 2]  # cut mid-object: not JSON
        out.append((f"c{i % 5000}".encode(), value))
    return out


async def create(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, p, 1) for t, p in topics.items()])
    finally:
        await admin.close()


async def preload(bootstrap: str, topic: str, data: list[tuple[bytes, bytes]]) -> None:
    await create(bootstrap, {topic: PARTITIONS})
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        batches = [producer.create_batch() for _ in range(PARTITIONS)]
        pending = []
        for key, value in data:
            p = partition_for_key(key, PARTITIONS)
            if batches[p].append(key=key, value=value, timestamp=None) is None:
                pending.append(await producer.send_batch(batches[p], topic, partition=p))
                batches[p] = producer.create_batch()
                batches[p].append(key=key, value=value, timestamp=None)
        for p, batch in enumerate(batches):
            if batch.record_count():
                pending.append(await producer.send_batch(batch, topic, partition=p))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


# -- the hand-written loop ------------------------------------------------------------------


def route_by_hand(v: Any) -> list[tuple[str, Any]]:
    """The three routes of ``router.ROUTES``, written by hand; raises for a bad order."""
    if not isinstance(v, dict):
        raise TypeError("not a JSON object")
    order, customer = v["order"], v.get("customer")
    out: list[tuple[str, Any]] = []
    if customer is not None and order["total"] > 1000 and customer["country"] in EU:
        out.append(
            (
                "orders-big",
                {
                    "order": {"id": order["id"], "total": order["total"]},
                    "customer": {"id": customer["id"]},
                },
            )
        )
    if order.get("express") is True:
        if customer is None:
            raise KeyError("customer.country")
        shipped = {"id": order["id"], "ship_to": customer["country"], "kind": "x"}
        out.append(("shipping-express", shipped))
        out.append(("audit", shipped))
    if customer is None or customer.get("test") is not True:
        if customer is None:
            raise KeyError("customer.email")
        digest = hashlib.sha256(b"pepper" + customer["email"].encode()).hexdigest()
        out.append(
            (
                "analytics",
                {
                    "order": {"id": order["id"], "total": order["total"]},
                    "customer": {"email": digest, "country": customer["country"].lower()},
                },
            )
        )
    return out


async def hand_written(
    bootstrap: str, source: str, n: int, tag: str, max_records: int
) -> tuple[float, float]:
    names = {t: f"{t}-{tag}" for t in ROUTE_TOPICS}
    dlq = f"hand-{tag}-dlq"
    await create(bootstrap, {**dict.fromkeys(names.values(), PARTITIONS), dlq: 1})
    consumer = aiokafka.AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=f"hand-{tag}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **FETCH,
        **GROUP_SETTINGS,
    )
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, **PRODUCE)
    await consumer.start()
    await producer.start()
    decode, encode = msgspec.json.decode, msgspec.json.Encoder().encode
    partition_of: dict[bytes | None, int] = {}
    try:
        seen, started, cpu, in_flight = 0, 0.0, 0.0, []
        while seen < n:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=max_records)
            if not fetched:
                continue
            if not seen:
                started, cpu = time.perf_counter(), time.process_time()
            batches: dict[tuple[str, int], list[tuple[Any, bytes, Any]]] = {}
            for tp, records in fetched.items():
                seen += len(records)
                for r in records:
                    try:
                        outs = route_by_hand(decode(r.value))
                    except Exception as exc:
                        headers = [
                            ("error.type", type(exc).__name__.encode()),
                            ("source.topic", tp.topic.encode()),
                            ("source.partition", str(tp.partition).encode()),
                            ("source.offset", str(r.offset).encode()),
                        ]
                        batches.setdefault((dlq, 0), []).append((r.key, r.value, headers))
                        continue
                    if not outs:
                        continue
                    p = partition_of.get(r.key)
                    if p is None:
                        p = partition_of[r.key] = partition_for_key(r.key, PARTITIONS)
                    for topic, value in outs:
                        batches.setdefault((names[topic], p), []).append(
                            (r.key, encode(value), None)
                        )
            sent = []
            for (topic, p), items in batches.items():
                batch = producer.create_batch()
                for key, value, headers in items:
                    if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                        sent.append(await producer.send_batch(batch, topic, partition=p))
                        batch = producer.create_batch()
                        batch.append(key=key, value=value, timestamp=None, headers=headers)
                sent.append(await producer.send_batch(batch, topic, partition=p))
            await asyncio.gather(*in_flight)  # the previous fetch's acks, then its commit
            in_flight = sent
            await consumer.commit()
        await asyncio.gather(*in_flight)
        await consumer.commit()
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await consumer.stop()
        await producer.stop()


def hand_written_rdkafka(source: str, n: int, tag: str, max_records: int) -> tuple[float, float]:
    """The same loop on confluent-kafka: blocking calls, nothing else runs meanwhile."""
    import confluent_kafka as ck

    names = {t: f"{t}-{tag}" for t in ROUTE_TOPICS}
    dlq = f"hand-{tag}-dlq"
    consumer = ck.Consumer(
        {
            "bootstrap.servers": BOOTSTRAP[0],
            "group.id": f"hand-{tag}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": FETCH["fetch_max_wait_ms"],
            "max.partition.fetch.bytes": FETCH["max_partition_fetch_bytes"],
            "fetch.queue.backoff.ms": 10,
            "session.timeout.ms": GROUP_SETTINGS["session_timeout_ms"],
            "heartbeat.interval.ms": GROUP_SETTINGS["heartbeat_interval_ms"],
        }
    )
    producer = ck.Producer(
        {
            "bootstrap.servers": BOOTSTRAP[0],
            "acks": PRODUCE["acks"],
            "linger.ms": PRODUCE["linger_ms"],
            "batch.size": PRODUCE["max_batch_size"],
        }
    )
    consumer.subscribe([source])
    decode, encode = msgspec.json.decode, msgspec.json.Encoder().encode
    partition_of: dict[bytes | None, int] = {}
    delivered = [0]

    def on_delivery(err: Any, _: Any) -> None:
        if err is not None:
            raise SystemExit(f"hand-written rdkafka loop: a send failed: {err}")
        delivered[0] += 1

    produce = producer.produce
    try:
        seen, sent, started, cpu = 0, 0, 0.0, 0.0
        behind: tuple[int, list[Any]] | None = None  # (sends to wait for, offsets to commit)
        while seen < n:
            records = consumer.consume(max_records, 0) or consumer.consume(1, 1.0)
            if not records:
                continue
            if not seen:
                started, cpu = time.perf_counter(), time.process_time()
            ends: dict[tuple[str, int], int] = {}
            for r in records:
                if r.error() is not None:
                    continue
                seen += 1
                key = r.key()
                ends[r.topic(), r.partition()] = r.offset() + 1
                try:
                    outs = route_by_hand(decode(r.value()))
                except Exception as exc:
                    headers = [
                        ("error.type", type(exc).__name__.encode()),
                        ("source.topic", r.topic().encode()),
                        ("source.partition", str(r.partition()).encode()),
                        ("source.offset", str(r.offset()).encode()),
                    ]
                    produce(dlq, r.value(), key, 0, on_delivery, headers=headers)
                    sent += 1
                    continue
                if not outs:
                    continue
                p = partition_of.get(key)
                if p is None:
                    p = partition_of[key] = partition_for_key(key, PARTITIONS)
                for topic, value in outs:
                    produce(names[topic], encode(value), key, p, on_delivery)
                    sent += 1
            # The previous fetch's sends delivered, then its commit.
            if behind is not None:
                while delivered[0] < behind[0]:
                    producer.poll(0.05)
                consumer.commit(offsets=behind[1], asynchronous=False)
            producer.poll(0)
            behind = (sent, [ck.TopicPartition(t, p, o) for (t, p), o in ends.items()])
        producer.flush()
        if behind is not None:
            consumer.commit(offsets=behind[1], asynchronous=False)
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        consumer.close()


# -- flowkit --------------------------------------------------------------------------------


async def with_flowkit(
    bootstrap: str, source: str, n: int, tag: str, max_records: int, guarantee: str = ""
) -> tuple[float, float]:
    routes = [{**r, "to": [f"{t}-{tag}" for t in r["to"]]} for r in router.ROUTES]
    app = router.make_app(routes, demo_traffic=False, name=f"flowkit-{tag}", source=source)
    settings = {**GROUP_SETTINGS, "client": CLIENT[0]}
    if guarantee == "exactly_once":
        # A member that misses its session is fenced for good under exactly-once (at least
        # once retries the commit): a longer session on this shared machine. Throughput
        # does not depend on it.
        settings["session_timeout_ms"] = 10_000
        settings["heartbeat_interval_ms"] = 1_000
    query = "&".join(f"{k}={v}" for k, v in settings.items())
    worker = flowkit.Worker(
        app,
        broker=f"kafka://{bootstrap}?{query}",
        max_fetch_records=max_records,
        processing_guarantee="exactly_once" if guarantee == "exactly_once" else None,
    )
    async with worker:
        while worker.records_in == 0:
            _check(worker)
            await asyncio.sleep(0.002)
        started, cpu = time.perf_counter(), time.process_time()
        while worker.records_in < n or not worker.is_idle():
            _check(worker)
            await asyncio.sleep(0.002)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return elapsed, cpu


def _check(worker: flowkit.Worker) -> None:
    if worker.error is not None or worker.stopping:
        raise SystemExit(f"the flowkit worker stopped: {worker.error!r}")


# -- reading back ---------------------------------------------------------------------------


async def read_back(bootstrap: str, topics: dict[str, str], dlq: str) -> tuple[Outputs, int]:
    """Every output (route topic, key, canonical value) and the number of dead letters."""
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", **FETCH
    )
    await consumer.start()
    tps = [aiokafka.TopicPartition(t, p) for t in topics.values() for p in range(PARTITIONS)]
    tps.append(aiokafka.TopicPartition(dlq, 0))
    route_of = {name: route for route, name in topics.items()}
    canonical = msgspec.json.Encoder(order="sorted").encode
    outputs: Outputs = Counter()
    letters = 0
    try:
        consumer.assign(tps)
        quiet = 0
        while quiet < 5:  # the high watermark is not trusted on Tansu: read until quiet
            fetched = await consumer.getmany(timeout_ms=200, max_records=50_000)
            quiet = 0 if fetched else quiet + 1
            for tp, records in fetched.items():
                if tp.topic == dlq:
                    letters += len(records)
                    continue
                for r in records:
                    value = canonical(msgspec.json.decode(r.value))
                    outputs[route_of[tp.topic], r.key, value] += 1
    finally:
        await consumer.stop()
    return outputs, letters


# -- rounds ---------------------------------------------------------------------------------


async def run(
    bootstrap: str, n: int, rounds: int, max_records: int, exactly_once: bool = False
) -> None:
    BOOTSTRAP[0] = bootstrap
    run_id = uuid.uuid4().hex[:6]
    sources = {"clean": f"router-in-clean-{run_id}", "bad": f"router-in-bad-{run_id}"}
    for kind, topic in sources.items():
        data = orders(n, bad=kind == "bad")
        await preload(bootstrap, topic, data)
        size = sum(len(v) for _, v in data) / n
        print(f"{kind}: {n:,} orders of {size:.0f} bytes in {topic}")
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in sources}
    cpu_results: dict[str, list[dict[str, float]]] = {kind: [] for kind in sources}
    outs_per_order: dict[str, float] = {}
    for i in range(rounds):
        for kind, source in sources.items():
            row, cpu = {}, {}
            contenders = ("hand-written", "flowkit", *(("exactly-once",) if exactly_once else ()))
            for who in contenders:
                tag = f"{run_id}-{kind}-{who[0]}{i}"
                gc.collect()
                if who != "hand-written":
                    guarantee = "exactly_once" if who == "exactly-once" else ""
                    row[who], cpu[who] = await with_flowkit(
                        bootstrap, source, n, tag, max_records, guarantee
                    )
                    dlq = f"flowkit-{tag}-dlq"
                else:
                    if CLIENT[0] == "rdkafka":
                        outputs = {f"{t}-{tag}": PARTITIONS for t in ROUTE_TOPICS}
                        await create(bootstrap, {**outputs, f"hand-{tag}-dlq": 1})
                        row[who], cpu[who] = hand_written_rdkafka(source, n, tag, max_records)
                    else:
                        row[who], cpu[who] = await hand_written(
                            bootstrap, source, n, tag, max_records
                        )
                    dlq = f"hand-{tag}-dlq"
                topics = {t: f"{t}-{tag}" for t in ROUTE_TOPICS}
                got = await read_back(bootstrap, topics, dlq)
                if who == "hand-written":
                    expected = got
                elif got != expected:
                    diff = (got[0] - expected[0]) + (expected[0] - got[0])
                    raise SystemExit(
                        f"{kind} round {i}: outputs differ ({sum(diff.values())} records; "
                        f"dead letters flowkit {got[1]}, hand-written {expected[1]})"
                    )
                outs_per_order[kind] = sum(got[0].values()) / n
            results[kind].append(row)
            cpu_results[kind].append(cpu)
            eos = f", exactly-once {n / row['exactly-once']:,.0f}/s" if exactly_once else ""
            print(
                f"round {i} {kind}: hand-written {n / row['hand-written']:,.0f}/s, "
                f"flowkit {n / row['flowkit']:,.0f}/s{eos} "
                f"(CPU {1e6 * cpu['hand-written'] / n:.1f} "
                f"and {1e6 * cpu['flowkit'] / n:.1f} us/order), outputs and dead letters equal",
                flush=True,
            )
    ratio = [("flowkit / hand-written", "flowkit", "hand-written")]
    if exactly_once:  # the cost of exactly-once: paired with at-least-once in each round
        ratio.append(("exactly-once / at-least-once", "exactly-once", "flowkit"))
    for kind, rows in results.items():
        print(f"\n{kind} ({outs_per_order[kind]:.2f} outputs per order):")
        report(rows, n, "order", ratio)
        # This process's CPU time (the client side; the broker's is not in it): steadier
        # than wall-clock time when other work shares the cores.
        print(f"in CPU time of this process ({kind}):")
        report(cpu_results[kind], n, "order", ratio)
    clean = min(r["flowkit"] for r in results["clean"])
    bad = min(r["flowkit"] for r in results["bad"])
    print(f"\nflowkit with 2.7 % bad records / without: {clean / bad:.2f}")
    clean = min(r["flowkit"] for r in cpu_results["clean"])
    bad = min(r["flowkit"] for r in cpu_results["bad"])
    print(f"the same in CPU time: {clean / bad:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-records", type=int, default=10_000)
    add_broker_options(parser)
    parser.add_argument("--client", choices=["aiokafka", "rdkafka"], default="aiokafka")
    parser.add_argument(
        "--exactly-once",
        action="store_true",
        help="also run flowkit with processing_guarantee='exactly_once' in each round "
        "(needs Apache Kafka: --bootstrap)",
    )
    args = parser.parse_args()
    CLIENT[0] = args.client
    configure_logging("error")
    with kafka_broker(args.bootstrap, args.broker) as (bootstrap, _):
        asyncio.run(run(bootstrap, args.orders, args.rounds, args.max_records, args.exactly_once))


if __name__ == "__main__":
    main()
