"""Raw consume rate on librdkafka: flowkit's consumer against confluent-kafka's own.

flowkit's ``RdkafkaConsumer`` (a consume thread that hands whole batches to the event loop)
against confluent-kafka's own asyncio consumer (``confluent_kafka.aio.AIOConsumer``: every
call in a thread pool) and a plain blocking ``consume`` loop, same topic, same fetch
settings, same run.

    python -m benchmarks.probes.rdkafka_consume [--records 400000] [--rounds 2] [--bootstrap H:P]

Pre-produces N small records into a 4-partition topic, reads them all back (group-less,
from offset 0) with each, and prints the best rate of each and the ratios. A ticker task
counts how often the event loop ran meanwhile: a consumer that blocked the loop would
show almost no ticks. Starts a Tansu broker unless given ``--bootstrap``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import confluent_kafka as ck
from confluent_kafka.aio import AIOConsumer

from benchmarks.kafka_broker import kafka_broker
from flowkit.records import TopicPartition
from flowkit.transports import TopicSpec
from flowkit.transports.rdkafka import RdkafkaTransport

PARTITIONS = 4
MAX_RECORDS = 10_000
FETCH = {
    "fetch.wait.max.ms": 50,
    "max.partition.fetch.bytes": 4 << 20,
    "fetch.queue.backoff.ms": 10,
}


def produce(bootstrap: str, topic: str, records: int) -> float:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    started = time.perf_counter()
    for i in range(records):
        value = b'{"n":%d,"pad":"xxxxxxxxxxxxxxxx"}' % i
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush()
    return records / (time.perf_counter() - started)


def _config(bootstrap: str) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        **FETCH,
    }


def blocking_loop(bootstrap: str, topic: str, records: int) -> float:
    consumer = ck.Consumer(_config(bootstrap))
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen, started = 0, 0.0
    while seen < records:
        got = consumer.consume(MAX_RECORDS, 0) or consumer.consume(1, 1.0)
        if got and not seen:
            started = time.perf_counter()
        seen += len(got)
    elapsed = time.perf_counter() - started
    consumer.close()
    return records / elapsed


async def _ticking(run: Callable[[], Awaitable[float]]) -> tuple[float, int]:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        return await run(), ticks
    finally:
        ticker.cancel()


async def aio_consumer(bootstrap: str, topic: str, records: int) -> float:
    consumer = AIOConsumer(_config(bootstrap), max_workers=2)
    await consumer.assign(
        [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)]
    )
    seen, started = 0, 0.0
    while seen < records:
        # consume(n, t) waits for n records or t seconds: a short t keeps batches flowing.
        got = await consumer.consume(MAX_RECORDS, 0.05)
        if got and not seen:
            started = time.perf_counter()
        seen += len(got)
    elapsed = time.perf_counter() - started
    await consumer.close()
    return records / elapsed


async def flowkit_consumer(bootstrap: str, topic: str, records: int) -> float:
    transport = RdkafkaTransport([bootstrap], fetch_max_wait_ms=50)
    try:
        consumer = transport.consumer(group_id=None)
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        seen, started = 0, 0.0
        while seen < records:
            batch = await consumer.getmany(1.0, MAX_RECORDS)
            if batch and not seen:
                started = time.perf_counter()
            for messages in batch.values():
                seen += len(messages)
        return records / (time.perf_counter() - started)
    finally:
        await transport.aclose()


async def run(bootstrap: str, records: int, rounds: int) -> None:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    transport = RdkafkaTransport([bootstrap])
    await transport.create_topics([TopicSpec(topic, PARTITIONS)])
    await transport.aclose()
    rate = produce(bootstrap, topic, records)
    print(f"{records:,} records of ~40 bytes in {PARTITIONS} partitions, produced at {rate:,.0f}/s")
    best = {"blocking": 0.0, "aio": 0.0, "flowkit": 0.0}
    ticks = {"aio": 0, "flowkit": 0}
    for _ in range(rounds):
        best["blocking"] = max(best["blocking"], blocking_loop(bootstrap, topic, records))
        r, t = await _ticking(lambda: aio_consumer(bootstrap, topic, records))
        best["aio"], ticks["aio"] = max(best["aio"], r), t
        r, t = await _ticking(lambda: flowkit_consumer(bootstrap, topic, records))
        best["flowkit"], ticks["flowkit"] = max(best["flowkit"], r), t
    print(f"blocking consume() loop        : {best['blocking']:>10,.0f} records/s")
    aio, flow = best["aio"], best["flowkit"]
    print(f"confluent AIOConsumer.consume  : {aio:>10,.0f} records/s  (ticks {ticks['aio']})")
    print(f"flowkit RdkafkaConsumer.getmany: {flow:>10,.0f} records/s  (ticks {ticks['flowkit']})")
    print(f"ratio flowkit / blocking loop  : {best['flowkit'] / best['blocking']:.2f}")
    print(f"ratio flowkit / AIOConsumer    : {best['flowkit'] / best['aio']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: Tansu)")
    args = parser.parse_args()
    with kafka_broker(args.bootstrap) as (bootstrap, _):
        asyncio.run(run(bootstrap, args.records, args.rounds))


if __name__ == "__main__":
    main()
