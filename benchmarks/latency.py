"""Latency at half the peak rate: a record's timestamp to its output's acknowledgement.

    python -m benchmarks.latency [--seconds 10] [--records 400000]          # memory broker
    python -m benchmarks.latency --kafka [--seconds 10] [--records 200000]  # Kafka, both clients
    (--broker apache-kafka: on Apache Kafka instead of Tansu; --bootstrap: on a running Kafka)

The app: an agent reads ``latency-in`` (4 partitions), filters, and yields one output per
record to ``latency-out``, carrying the input record's timestamp. First the peak rate is
measured (``--records`` pre-loaded records, the worker timed until all are processed);
then a producer sends records at **half that rate** for ``--seconds``, each stamped with
the wall clock when it is sent, while the worker runs. The broker acknowledging an output
is observed at the worker's own producer (the acks of its sends to ``latency-out``), and
its latency is that moment minus the input record's timestamp. Records sent in the first
second are a warm-up and are not counted. On the memory broker the producer runs in the
worker's event loop (the embedded broker lives there); on Kafka it is a separate process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from typing import Any

import msgspec

import flowkit
from benchmarks.kafka_broker import add_broker_options, kafka_broker
from flowkit.logs import configure_logging
from flowkit.transports import MemoryBroker, MemoryTransport, Transport

APP = "latency-bench"
IN, OUT = "latency-in", "latency-out"
PARTITIONS = 4
WARMUP = 1.0
FRACTION = 0.5  # --fraction: the rate of the latency run, as a fraction of the peak


class Reading(flowkit.Record):
    sensor: str
    value: float


class Stamped(flowkit.Record):
    sensor: str
    value: float
    sent_ms: int  # the input record's timestamp


def make_app(name: str = APP, source: str = IN) -> flowkit.App:
    app = flowkit.App(name, partitions=PARTITIONS)
    readings = app.topic(source, value_type=Reading)
    out = app.topic(OUT, value_type=Stamped)

    @app.agent(readings, sink=[out])
    async def stamp(stream: flowkit.Stream[Reading]) -> Any:
        async for e in stream.filter(lambda r: r.value >= 0).events():
            yield Stamped(e.value.sensor, e.value.value, e.timestamp)

    return app


# -- observing acks ----------------------------------------------------------------------


class AckClock:
    """Wraps a transport: the acks of its producers' sends to ``OUT``, with their time."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.acked: list[tuple[float, list[bytes | None]]] = []  # (ack time, values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> AckClock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.aclose()

    def producer(self, **kwargs: Any) -> Any:
        return _AckProducer(self.inner.producer(**kwargs), self.acked)

    def latencies_ms(self, warmup: float) -> list[float]:
        """Latencies of the records sent ``warmup`` seconds or more after the first one."""
        decode = msgspec.json.Decoder(Stamped).decode
        stamped = [
            (acked, decode(raw).sent_ms)  # type: ignore[arg-type]
            for acked, values in self.acked
            for raw in values
        ]
        since_ms = min((sent for _, sent in stamped), default=0) + warmup * 1000
        return [acked - sent for acked, sent in stamped if sent >= since_ms]


class _AckProducer:
    def __init__(self, inner: Any, acked: list[tuple[float, list[bytes | None]]]) -> None:
        self.inner = inner
        self.acked = acked

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send_batch(self, topic: str, partition: int, records: Any) -> Any:
        acks = await self.inner.send_batch(topic, partition, records)
        if topic == OUT:
            values = [value for _, value, _, _ in records]
            i = 0
            for count, ack in acks:
                self._watch(ack, values[i : i + count])
                i += count
        return acks

    def _watch(self, ack: Any, values: list[bytes | None]) -> None:
        if not hasattr(ack, "add_done_callback"):  # already stored (the memory broker)
            self.acked.append((time.time() * 1000, values))
            return
        ack.add_done_callback(lambda _: self.acked.append((time.time() * 1000, values)))


def percentiles(ms: list[float]) -> str:
    ms = sorted(ms)
    q = statistics.quantiles(ms, n=1000, method="inclusive")
    return (
        f"p50 {q[499]:6.1f} ms   p99 {q[989]:6.1f} ms   p99.9 {q[998]:6.1f} ms"
        f"   max {ms[-1]:6.1f} ms"
    )


def _encoded(n: int) -> list[tuple[bytes, bytes]]:
    enc = msgspec.json.Encoder()
    return [
        (f"s{i % 1000}".encode(), enc.encode(Reading(f"s{i % 1000}", i * 0.5))) for i in range(n)
    ]


async def _until(worker: flowkit.Worker, condition: Any, deadline: float = 600) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if worker.error is not None:
            raise SystemExit(f"the worker stopped: {worker.error!r}")
        if time.monotonic() > end:
            raise SystemExit("the worker did not finish in time")
        await asyncio.sleep(0.002)


# -- memory broker -----------------------------------------------------------------------


async def memory_peak(n: int) -> float:
    broker = MemoryBroker(retention_records=None)
    producer = MemoryTransport(broker).producer()
    broker.create_topic(IN, PARTITIONS)
    for key, value in _encoded(n):
        await producer.send(IN, value, key=key)
    worker = flowkit.Worker(make_app(), transport=MemoryTransport(broker), status_interval=None)
    async with worker:
        await _until(worker, lambda: worker.records_in > 0)
        start = time.perf_counter()
        await _until(worker, lambda: worker.records_in >= n and worker.is_idle())
        return n / (time.perf_counter() - start)


async def memory_latency(
    rate: float, seconds: float, warmup: float = WARMUP
) -> tuple[list[float], int]:
    broker = MemoryBroker(retention_records=100_000)
    transport = AckClock(MemoryTransport(broker))
    producer = MemoryTransport(broker).producer()
    broker.create_topic(IN, PARTITIONS)
    payload = _encoded(1000)
    worker = flowkit.Worker(make_app(), transport=transport, status_interval=None)  # type: ignore[arg-type]
    async with worker:
        started, sent = time.time(), 0
        while (now := time.time()) < started + seconds:
            due = int((now - started) * rate)
            now_ms = int(now * 1000)
            while sent < due:
                key, value = payload[sent % 1000]
                await producer.send(IN, value, key=key, timestamp_ms=now_ms)
                sent += 1
            await asyncio.sleep(0.001)
        await _until(worker, lambda: worker.records_in >= sent and worker.is_idle())
    return transport.latencies_ms(warmup), sent


def run_memory(records: int, seconds: float) -> None:
    peak = asyncio.run(memory_peak(records))
    gc.collect()
    print(f"memory broker: peak {peak:,.0f} records/s ({records:,} pre-loaded records)")
    ms, sent = asyncio.run(memory_latency(peak * FRACTION, seconds))
    rate = f"{peak * FRACTION:,.0f} records/s"
    print(f"  at {rate} for {seconds:.0f} s: {sent:,} sent, {len(ms):,} counted")
    print(f"  timestamp -> output acked: {percentiles(ms)}")


# -- Kafka -----------------------------------------------------------------------------


async def kafka_preload(bootstrap: str, topic: str, n: int) -> None:
    import aiokafka
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    if not n:
        return
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=k) for k, v in _encoded(n)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def kafka_produce(bootstrap: str, topic: str, rate: float, seconds: float) -> int:
    """Send at ``rate`` records/s for ``seconds``, each stamped when sent (a child process)."""
    import aiokafka

    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
    await producer.start()
    payload = _encoded(1000)
    try:
        started, sent = time.time(), 0
        while (now := time.time()) < started + seconds:
            due = int((now - started) * rate)
            now_ms = int(now * 1000)
            while sent < due:
                key, value = payload[sent % 1000]
                await producer.send(topic, value, key=key, timestamp_ms=now_ms)
                sent += 1
            await asyncio.sleep(0.001)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


async def kafka_run(bootstrap: str, client: str, records: int, seconds: float) -> None:
    from benchmarks.ysb_clients import broker_url

    name = f"{APP}-{client}-{time.time_ns() % 10**8}"
    # Peak: a worker of its own group over a pre-loaded topic.
    peak_in = f"{name}-peak"
    await kafka_preload(bootstrap, peak_in, records)
    app = make_app(name + "-p", peak_in)
    worker = flowkit.Worker(app, broker=broker_url(bootstrap, client), status_interval=None)
    async with worker:
        await _until(worker, lambda: worker.records_in > 0)
        start = time.perf_counter()
        await _until(worker, lambda: worker.records_in >= records and worker.is_idle())
        peak = records / (time.perf_counter() - start)
    print(f"Kafka, {client}: peak {peak:,.0f} records/s ({records:,} pre-loaded records)")
    # Latency at half the peak: the producer in a process of its own.
    source = f"{name}-in"  # a topic of this run's own: the group reads from the earliest
    await kafka_preload(bootstrap, source, 0)
    from flowkit.transports import transport_from_url

    transport = AckClock(transport_from_url(broker_url(bootstrap, client)))
    worker = flowkit.Worker(make_app(name, source), transport=transport, status_interval=None)  # type: ignore[arg-type]
    async with worker:
        # The group join: produce only once the worker holds its partitions.
        await _until(
            worker, lambda: bool(worker.fetcher and worker.fetcher.consumer.assignment()), 60
        )
        cmd = [sys.executable, "-m", "benchmarks.latency", "--produce", bootstrap]
        cmd += ["--rate", str(peak * FRACTION), "--seconds", str(seconds), "--topic", source]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        sent = json.loads(out)["sent"]
        await _until(worker, lambda: worker.records_in >= sent and worker.is_idle(), 120)
    ms = transport.latencies_ms(WARMUP)
    rate = f"{peak * FRACTION:,.0f} records/s"
    print(f"  at {rate} for {seconds:.0f} s: {sent:,} sent, {len(ms):,} counted")
    print(f"  timestamp -> output acked: {percentiles(ms)}")


def run_kafka(records: int, seconds: float, bootstrap: str | None, broker: str = "tansu") -> None:
    with kafka_broker(bootstrap, broker) as (address, _):
        for client in ("aiokafka", "rdkafka"):
            gc.collect()
            asyncio.run(kafka_run(address, client, records, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description="latency at half the peak rate")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--records", type=int, help="records for the peak rate")
    parser.add_argument("--kafka", action="store_true", help="on Kafka, both clients")
    add_broker_options(parser)  # --bootstrap, --broker tansu|apache-kafka (with --kafka)
    parser.add_argument("--fraction", type=float, default=0.5, help="of the peak (0.5)")
    parser.add_argument("--produce", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--topic", default=IN, help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("warning")
    global FRACTION
    FRACTION = args.fraction
    if args.produce:
        sent = asyncio.run(kafka_produce(args.produce, args.topic, args.rate, args.seconds))
        print(json.dumps({"sent": sent}))
    elif args.kafka:
        run_kafka(args.records or 200_000, args.seconds, args.bootstrap, args.broker)
    else:
        run_memory(args.records or 400_000, args.seconds)


if __name__ == "__main__":
    main()
