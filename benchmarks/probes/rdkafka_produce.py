"""What a record costs to produce on confluent-kafka, by the shape of the call.

    python -m benchmarks.probes.rdkafka_produce [--records 100000] [--rounds 5]

Starts a Tansu broker (unless ``--bootstrap`` names a running Kafka) and, in paired rounds,
produces the same ``--records`` router-sized records (~60 bytes, 5,000 keys, to 4 partitions
chosen by the caller) with each variant, one thread, ``poll(0)`` every 10,000 records, then
waits for every delivery report. It prints the CPU time of the process (librdkafka's
threads included) per record, median and range over the rounds:

* ``no callback``: ``produce(topic, value, key, partition)``, the floor;
* ``positional + function``: the hand-written loops' call, a plain function counting reports;
* ``keywords + function``: the same with ``partition=``, ``on_delivery=``, ``timestamp=`` and
  ``headers=`` named (confluent-kafka looks each keyword up by name);
* ``positional + locked method``: a bound method that counts under a ``threading.Lock``;
* ``flowkit before``: keywords and the locked method (the transport until 2026-11-30);
* ``flowkit``: the transport's own ``_queue`` and ``RdkafkaProducer._batch_delivery``
  (positional arguments, one lock-free closure per batch);
* ``produce_batch + function``: confluent-kafka's ``produce_batch``, one call a partition
  with a dict a record, made from the tuples the transport gets;
* ``positional + function, errors only``: the hand-written call on a producer with
  ``delivery.report.only.error``, where successful deliveries never reach Python.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck

from benchmarks.kafka_broker import kafka_broker
from flowkit.transports.rdkafka import producer as rdproducer

Records = list[tuple[bytes, bytes]]


class _Counter:
    __slots__ = ("error", "lock", "n")

    def __init__(self) -> None:
        self.n, self.error, self.lock = 0, None, threading.Lock()

    def delivered(self, error: Any, record: Any) -> None:
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.n += 1


class _Done:
    """Stands in for the producer whose ``_done`` list ``_batch_delivery`` appends to."""

    def __init__(self) -> None:
        self._done: list[Any] = []


def _variants(producer: Any, topic: str) -> dict[str, Callable[[Records], None]]:
    produce, produce_batch = producer.produce, producer.produce_batch
    seen = [0]

    def count(error: Any, record: Any) -> None:
        seen[0] += 1

    def none(records: Records) -> None:
        for i, (key, value) in enumerate(records):
            produce(topic, value, key, i & 3)

    def positional(records: Records) -> None:
        for i, (key, value) in enumerate(records):
            produce(topic, value, key, i & 3, count)

    def keywords(records: Records) -> None:
        for i, (key, value) in enumerate(records):
            produce(
                topic, value, key, partition=i & 3, on_delivery=count, timestamp=0, headers=None
            )

    def locked(records: Records) -> None:
        delivered = _Counter().delivered
        for i, (key, value) in enumerate(records):
            produce(topic, value, key, i & 3, delivered)

    def before(records: Records) -> None:
        delivered = _Counter().delivered
        for i, (key, value) in enumerate(records):
            produce(
                topic, value, key, partition=i & 3, on_delivery=delivered, timestamp=0, headers=None
            )

    def flowkit(records: Records) -> None:
        # As send_batch hands them over: one batch per partition.
        for p in range(4):
            batch = [(key, value, (), None) for key, value in records[p::4]]
            delivered = rdproducer.RdkafkaProducer._batch_delivery(_Done(), None, len(batch))  # type: ignore[arg-type]
            rdproducer._queue(produce, topic, p, batch, 0, delivered)

    def batch_call(records: Records) -> None:
        # confluent-kafka's produce_batch: one call a partition, a dict a record (it drops
        # headers and refuses timestamps, so dead letters could not use it).
        # From the same (key, value, headers, timestamp) tuples as ``flowkit`` below.
        for p in range(4):
            batch = [(key, value, (), None) for key, value in records[p::4]]
            messages = [{"key": key, "value": value} for key, value, _, _ in batch]
            produce_batch(topic, messages, p, count)

    return {
        "no callback": none,
        "positional + function": positional,
        "keywords + function": keywords,
        "positional + locked method": locked,
        "flowkit before": before,
        "flowkit": flowkit,
        "produce_batch + function": batch_call,
    }


def run(bootstrap: str, n: int, rounds: int) -> None:
    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 256 * 1024,
    }
    producer = ck.Producer(config)
    # Only failed deliveries reach Python: what a success report costs, by difference.
    errors_only = ck.Producer({**config, "delivery.report.only.error": True})
    topic = f"produce-{uuid.uuid4().hex[:8]}"
    for client in (producer, errors_only):
        client.list_topics(topic)  # created with 4 partitions (Tansu's default)
        client.flush()
    records = [
        (f"c{i % 5000}".encode(), b'{"order":{"id":"o%d","total":1234},"customer":{"id":"c1"}}' % i)
        for i in range(n)
    ]
    variants = {name: (producer, v) for name, v in _variants(producer, topic).items()}
    only = _variants(errors_only, topic)["positional + function"]
    variants["positional + function, errors only"] = (errors_only, only)
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (client, variant) in variants.items():
            started = time.process_time()
            for start in range(0, n, 10_000):
                variant(records[start : start + 10_000])
                client.poll(0)
            while len(client):
                client.poll(0.01)
            cpu[name].append((time.process_time() - started) * 1e6 / n)
    print(f"{n:,} records a round, {rounds} rounds; µs of CPU a record, median (range)")
    for name, values in cpu.items():
        print(f"{name:36s} {statistics.median(values):5.2f} ({min(values):.2f}-{max(values):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description="confluent-kafka produce(): cost by call shape")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: Tansu)")
    args = parser.parse_args()
    with kafka_broker(args.bootstrap) as (bootstrap, _):
        run(bootstrap, args.records, args.rounds)


if __name__ == "__main__":
    main()
