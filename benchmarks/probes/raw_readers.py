"""What the broker itself serves: one and two bare reader processes of the YSB topic.

The YSB topic read by reader processes that do nothing with the records (no app, no
decoding), one process against two, same fetch settings.

    python -m benchmarks.probes.raw_readers --bootstrap HOST:PORT [--repeat 3]

``benchmarks.scale_out`` runs this beside the flowkit runs, against the same broker and
topic: if two bare readers are not faster than one, a second worker process cannot be
either, whatever it does with the records. Each reader is flowkit's ``KafkaConsumer``
(group-less, partitions assigned: no group join to wait for) and reads its partitions
from the start to their end; the clock runs from its first records to its last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from benchmarks.ysb_kafka import EVENTS, FETCH
from examples import ysb
from flowkit.errors import TransportError
from flowkit.records import TopicPartition
from flowkit.transports.kafka import KafkaTransport

MAX_RECORDS = 10_000  # a worker's max_fetch_records


async def read(bootstrap: str, partitions: list[int]) -> dict[str, float]:
    """Read ``partitions`` of the YSB topic to their end: records, seconds, CPU seconds."""
    transport = KafkaTransport([bootstrap], **FETCH)
    try:
        consumer = transport.consumer(group_id=None, client_id="raw-reader")
        tps = [TopicPartition(EVENTS, p) for p in partitions]
        consumer.assign(tps)
        count, start, cpu = 0, 0.0, 0.0
        while not start or not at_end(consumer, tps):
            batches = await consumer.getmany(1.0, MAX_RECORDS)
            if batches and not start:
                start, cpu = time.perf_counter(), time.process_time()
            count += sum(len(messages) for messages in batches.values())
        return {
            "records": count,
            "seconds": time.perf_counter() - start,
            "cpu": time.process_time() - cpu,
        }
    finally:
        await transport.aclose()


def at_end(consumer: object, tps: list[TopicPartition]) -> bool:
    try:
        for tp in tps:
            high = consumer.highwater(tp)  # type: ignore[attr-defined]
            if high is None or consumer.position(tp) < high:  # type: ignore[attr-defined]
                return False
    except TransportError:  # no position yet
        return False
    return True


async def readers(bootstrap: str, processes: int) -> tuple[float, list[float]]:
    """``processes`` reader processes sharing the partitions: (records/s of them together,
    each one's share of a core while it read)."""
    parts = [
        ",".join(str(p) for p in range(ysb.PARTITIONS) if p % processes == i)
        for i in range(processes)
    ]
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.probes.raw_readers",
            "--bootstrap",
            bootstrap,
            "--partitions",
            p,
            stdout=asyncio.subprocess.PIPE,
        )
        for p in parts
    ]
    results = [json.loads((await proc.communicate())[0]) for proc in procs]
    records = sum(r["records"] for r in results)
    # They start together; the rate is the whole topic over the slowest reader's time.
    return records / max(r["seconds"] for r in results), [r["cpu"] / r["seconds"] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description="bare readers of the YSB topic, 1 and 2")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--partitions", help="(a reader process) read these and print JSON")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.partitions:
        parts = [int(p) for p in args.partitions.split(",")]
        print(json.dumps(asyncio.run(read(args.bootstrap, parts))))
        return
    for r in range(args.repeat):
        for n in (1, 2):
            rate, shares = asyncio.run(readers(args.bootstrap, n))
            cpu = ", ".join(f"{s:.0%}" for s in shares)
            print(f"round {r + 1}: {n} reader process(es) {rate:,.0f} records/s (CPU {cpu})")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
