"""Core throughput: decode -> filter -> count per key, flowkit vs a hand-written loop.

Both run in this process over the same pre-encoded JSON records (about 250 bytes each):

* hand-written: ``for data in payloads: v = decode(data); if v.kind == "view": counts[v.page] += 1``
* flowkit: the records pre-loaded into a 4-partition topic on the memory broker, a worker
  with one agent doing the same filter and count, timed until every record is processed.

    python -m benchmarks.throughput [--records 1000000] [--partitions 4] [--repeat 5]

Prints records/s for both and the ratio flowkit / hand-written over ``--repeat`` paired
rounds (see ``benchmarks/rounds.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
from collections import Counter

import msgspec

import flowkit
from benchmarks.callgrind import compare
from benchmarks.rounds import against_hand_written
from flowkit.logs import configure_logging
from flowkit.transports import MemoryBroker, MemoryTransport


class Event(flowkit.Record):
    user_id: str
    page_id: str
    ad_id: str
    ad_type: str
    event_type: str
    event_time: int
    ip_address: str


def make_payloads(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    enc = msgspec.json.Encoder()
    kinds = ("view", "click", "purchase")
    pages = [f"{rng.getrandbits(128):032x}" for _ in range(100)]
    out = []
    for i in range(n):
        out.append(
            enc.encode(
                Event(
                    user_id=f"{rng.getrandbits(128):032x}",
                    page_id=rng.choice(pages),
                    ad_id=f"{rng.getrandbits(128):032x}",
                    ad_type=rng.choice(("banner", "modal", "sponsored-search", "mail", "mobile")),
                    event_type=kinds[i % 3],
                    event_time=1_700_000_000_000 + i,
                    ip_address="1.2.3.4",
                )
            )
        )
    return out


def hand_written(payloads: list[bytes]) -> tuple[float, Counter[str]]:
    decode = msgspec.json.Decoder(Event).decode
    counts: Counter[str] = Counter()
    start = time.perf_counter()
    for data in payloads:
        v = decode(data)
        if v.event_type == "view":
            counts[v.page_id] += 1
    return time.perf_counter() - start, counts


def hand_written_over_logs(broker: MemoryBroker, partitions: int) -> float:
    """The same loop over the records as the broker stores them (what a consumer reads)."""
    decode = msgspec.json.Decoder(Event).decode
    counts: Counter[str] = Counter()
    start = time.perf_counter()
    for partition in range(partitions):
        for message in broker.messages("events", partition):
            v = decode(message.value)
            if v.event_type == "view":
                counts[v.page_id] += 1
    return time.perf_counter() - start


async def loaded_broker(payloads: list[bytes], partitions: int) -> MemoryBroker:
    """A memory broker with the payloads split over ``partitions`` partitions, loaded one
    partition after the other and copied: each partition's records sit together in memory,
    as in a broker's log files and in what a Kafka consumer fetches (round-robin sends of
    the producer's own objects would interleave them record by record)."""
    broker = MemoryBroker(retention_records=None)
    broker.create_topic("events", partitions)
    producer = MemoryTransport(broker).producer()
    for i, data in enumerate(payloads):
        # The broker's own copy of the bytes, as a consumer receives them from Kafka.
        value = bytes(memoryview(data))
        await producer.send("events", value, partition=i * partitions // len(payloads))
    return broker


async def run_counting_worker(broker: MemoryBroker, partitions: int, total: int) -> Counter[str]:
    """Run a worker that filters and counts until it has processed ``total`` records."""
    app = flowkit.App("bench")
    events = app.topic("events", value_type=Event, partitions=partitions)
    counts: Counter[str] = Counter()

    @app.agent(events)
    async def count(stream: flowkit.Stream[Event]) -> None:
        async for v in stream.filter(lambda v: v.event_type == "view"):
            counts[v.page_id] += 1

    worker = flowkit.Worker(app, transport=MemoryTransport(broker))
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < total or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    return counts


async def with_flowkit(payloads: list[bytes], partitions: int) -> tuple[float, Counter[str], float]:
    broker = await loaded_broker(payloads, partitions)
    start = time.perf_counter()
    counts = await asyncio.wait_for(run_counting_worker(broker, partitions, len(payloads)), 600)
    elapsed = time.perf_counter() - start
    gc.collect()
    return elapsed, counts, hand_written_over_logs(broker, partitions)


async def _load_and_maybe_run(payloads: list[bytes], partitions: int, run: bool) -> None:
    broker = await loaded_broker(payloads, partitions)
    if run:
        await run_counting_worker(broker, partitions, len(payloads))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare instruction counts under valgrind (use --records 50000)",
    )
    parser.add_argument("--part", choices=["setup", "hand", "flowkit"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("warning")
    if args.instructions:
        compare("benchmarks.throughput", "--records", args.records, "record")
        return
    if args.part:
        payloads = make_payloads(args.records)
        # The broker is loaded in every part, so the differences are the loops alone.
        asyncio.run(_load_and_maybe_run(payloads, args.partitions, args.part == "flowkit"))
        if args.part == "hand":
            hand_written(payloads)
        return
    payloads = make_payloads(args.records)
    size = sum(map(len, payloads)) / len(payloads)
    print(f"{args.records:,} records of {size:.0f} bytes, {args.partitions} partitions")
    against_hand_written(
        args.repeat,
        args.records,
        "record",
        lambda: hand_written(payloads),
        lambda: asyncio.run(with_flowkit(payloads, args.partitions)),
        "flowkit counted differently from the hand-written loop",
    )


if __name__ == "__main__":
    main()
