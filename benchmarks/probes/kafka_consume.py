"""Raw consume rate: flowkit's ``KafkaConsumer.getmany`` against aiokafka's own ``getmany``.

Pre-produces N small records into a 4-partition topic, then reads them all back several
times with each consumer (same fetch settings, group-less, from offset 0) and prints the
best rate of each and their ratio. Starts a Tansu broker unless given ``--bootstrap``.

    python -m benchmarks.probes.kafka_consume --records 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import aiokafka

from benchmarks.kafka_broker import kafka_broker
from flowkit.records import TopicPartition
from flowkit.transports import TopicSpec
from flowkit.transports.kafka import KafkaTransport

PARTITIONS = 4
MAX_RECORDS = 10_000


async def produce(bootstrap: str, topic: str, records: int) -> float:
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024
    )
    await producer.start()
    started = time.perf_counter()
    try:
        futures = []
        for i in range(records):
            value = b'{"n":%d,"pad":"xxxxxxxxxxxxxxxx"}' % i
            futures.append(await producer.send(topic, value, partition=i % PARTITIONS))
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return records / (time.perf_counter() - started)


async def raw_aiokafka(bootstrap: str, topic: str, records: int, **fetch: int) -> float:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", **fetch
    )
    await consumer.start()
    try:
        consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        seen, started = 0, time.perf_counter()
        while seen < records:
            batch = await consumer.getmany(timeout_ms=1000, max_records=MAX_RECORDS)
            for messages in batch.values():
                seen += len(messages)
        return seen / (time.perf_counter() - started)
    finally:
        await consumer.stop()


async def flowkit_consumer(transport: KafkaTransport, topic: str, records: int) -> float:
    consumer = transport.consumer(group_id=None)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        seen, started = 0, time.perf_counter()
        while seen < records:
            batch = await consumer.getmany(1.0, MAX_RECORDS)
            for messages in batch.values():
                seen += len(messages)
        return seen / (time.perf_counter() - started)
    finally:
        await consumer.aclose()


async def main(bootstrap: str, records: int, rounds: int) -> None:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    async with KafkaTransport([bootstrap]) as transport:
        await transport.create_topics([TopicSpec(topic, PARTITIONS)])
        rate = await produce(bootstrap, topic, records)
        print(f"produced {records} records into {PARTITIONS} partitions at {rate:,.0f}/s")
        # The same fetch settings on both sides: the comparison is of the adapters.
        fetch = {
            k: transport._consumer[k] for k in ("fetch_max_wait_ms", "max_partition_fetch_bytes")
        }
        raw, ours, stock = [], [], []
        for _ in range(rounds):
            raw.append(await raw_aiokafka(bootstrap, topic, records, **fetch))
            ours.append(await flowkit_consumer(transport, topic, records))
            stock.append(await raw_aiokafka(bootstrap, topic, records))
    print(f"aiokafka getmany, aiokafka default fetch settings: {max(stock):>10,.0f} records/s")
    print(f"aiokafka getmany, flowkit fetch settings {fetch}: {max(raw):>10,.0f} records/s")
    print(f"flowkit KafkaConsumer.getmany:                      {max(ours):>10,.0f} records/s")
    print(f"ratio flowkit / aiokafka (same settings): {max(ours) / max(raw):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="host:port of a running broker (default: start Tansu)")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with kafka_broker(args.bootstrap) as (bootstrap, _):
        asyncio.run(main(bootstrap, args.records, args.rounds))
