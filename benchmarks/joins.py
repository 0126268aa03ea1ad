"""A windowed stream-stream join: flowkit vs a hand-written loop, same data, same process.

    python -m benchmarks.joins [--orders 200000] [--repeat 5]

The data is ``examples/payments.py``'s: N orders, one every 100 ms of event time, and a
payment for 90% of them, up to 20 s after (or 2 s before) its order, both keyed by order
id on 4 partitions. The query is the example's left join within 60 s (grace 10 s): each
order comes out once, with its payment or, once its window has closed, without.

* hand-written: the records in timestamp order, decoded with msgspec; a dict per side of
  records waiting for their match, by key; a match pops its partner; what is left of the
  orders at the end is unpaid (with unique order ids, no window bookkeeping is needed);
* flowkit: the example app run by a worker over both topics pre-loaded on the memory
  broker (timestamp-ordered merge per partition, changelog-backed buffers, outputs sent
  to two topics), timed until every record is processed, then checked against the
  hand-written result. Its changelog and output sends are part of its time.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import time
from typing import Any

import msgspec

import flowkit
from benchmarks.rounds import against_hand_written
from examples import payments
from flowkit.logs import configure_logging
from flowkit.records import TopicPartition
from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker, MemoryTransport, read_to_end

START_MS = 1_700_000_000_000
Data = list[tuple[str, bytes, bytes, int]]  # (topic, key, value, timestamp)
Result = tuple[list[str], list[str]]  # (paid order ids, unpaid order ids), sorted


def data_set(n: int) -> Data:
    enc = msgspec.json.Encoder()
    return [
        (topic, key.encode(), enc.encode(value), ts)
        for topic, key, value, ts in payments.sample(n, start_ms=START_MS)
    ]


def join(records: Any) -> Result:
    """The hand-written left join over (topic, key, value, timestamp) in time order."""
    decode_order = msgspec.json.Decoder(payments.Order).decode
    decode_payment = msgspec.json.Decoder(payments.Payment).decode
    window = int(payments.WITHIN * 1000)
    orders: dict[bytes, tuple[int, Any]] = {}
    waiting: dict[bytes, tuple[int, Any]] = {}
    paid: list[str] = []
    for topic, key, raw, ts in records:
        if topic == "orders":
            order = decode_order(raw)
            payment = waiting.pop(key, None)
            if payment is not None and abs(payment[0] - ts) <= window:
                paid.append(order.id)
            else:
                orders[key] = (ts, order)
        else:
            decode_payment(raw)
            found = orders.pop(key, None)
            if found is not None and abs(found[0] - ts) <= window:
                paid.append(found[1].id)
            else:
                waiting[key] = (ts, None)
    return sorted(paid), sorted(o.id for _, o in orders.values())


def hand_written(data: Data) -> tuple[float, Result]:
    start = time.perf_counter()
    result = join(data)
    return time.perf_counter() - start, result


def hand_written_over_logs(broker: MemoryBroker) -> float:
    """The same loop over what a consumer reads: each partition's two logs merged by
    timestamp."""

    def log(topic: str, p: int) -> Any:
        return ((m.timestamp, topic, m.key, m.value) for m in broker.messages(topic, p) if m.key)

    start = time.perf_counter()
    for p in range(payments.PARTITIONS):
        merged = heapq.merge(log("orders", p), log("payments", p), key=lambda r: r[0])
        join((t, k, v, ts) for ts, t, k, v in merged)
    return time.perf_counter() - start


async def loaded_broker(data: Data) -> MemoryBroker:
    broker = MemoryBroker(retention_records=None)
    producer = MemoryTransport(broker).producer()
    for topic in ("orders", "payments"):
        broker.create_topic(topic, payments.PARTITIONS)
    for topic, key, raw, ts in data:
        await producer.send(topic, bytes(memoryview(raw)), key=key, timestamp_ms=ts)
    end = data[-1][3] + 3_600_000
    for p in range(payments.PARTITIONS):  # one keyless record far ahead closes every window
        await producer.send("orders", b"{}", key=None, partition=p, timestamp_ms=end)
    return broker


async def with_flowkit(data: Data) -> tuple[float, Result, float]:
    broker = await loaded_broker(data)
    transport = MemoryTransport(broker)
    app = payments.make_app(generate=False)
    worker = flowkit.Worker(app, transport=transport, clock=FakeClock(START_MS / 1000 + 3600))
    total = len(data) + payments.PARTITIONS
    async with worker:
        start = time.perf_counter()
        while worker.records_in < total or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
    reader = transport.consumer(group_id=None)
    ids: dict[str, list[str]] = {"paid-orders": [], "unpaid-orders": []}
    tps = {TopicPartition(t, p) for t in ids for p in range(payments.PARTITIONS)}
    reader.assign(tps)

    def add(tp: TopicPartition, messages: list[flowkit.Message]) -> None:
        decode = app.topics[tp.topic].decode
        ids[tp.topic].extend(decode(m.value).id for m in messages)  # type: ignore[arg-type]

    await read_to_end(reader, tps, add)
    result = (sorted(ids["paid-orders"]), sorted(ids["unpaid-orders"]))
    return elapsed, result, hand_written_over_logs(broker)


def main() -> None:
    parser = argparse.ArgumentParser(description="A stream-stream join: flowkit vs by hand")
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    configure_logging("warning")
    data = data_set(args.orders)
    print(f"{args.orders:,} orders and {len(data) - args.orders:,} payments, left join")
    against_hand_written(
        args.repeat,
        len(data),
        "record",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data)),
        "flowkit's join results differ from the hand-written loop's",
    )
    print("join results: identical to the hand-written loop's in every round")


if __name__ == "__main__":
    main()
