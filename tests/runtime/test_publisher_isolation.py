"""A broker refuses a whole broker batch for one record in it (Apache Kafka: a timestamp
over an hour ahead), and a client puts the sends of one partition in one broker batch as it
likes, batches and single sends alike. The publisher believes a refusal only for a record
sent alone: the culprits, and only they, go to ``on_rejected``; every other record is
written, once.

The producer here plays both parts (a client's batching, per event-loop turn, and a
broker's refusal); the same on Apache Kafka with both clients:
tests/runtime/test_refusals.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from flowkit.errors import RecordRejected
from flowkit.records import Headers
from flowkit.runtime.output.publisher import Publisher
from flowkit.transports import Ack, MemoryBroker, OutRecord
from flowkit.transports.memory.clients import MemoryProducer

TOPIC = "out"
REFUSED = -1  # the timestamp the broker refuses


class _BatchingProducer(MemoryProducer):
    """Sends of one partition made in one turn of the event loop go as one broker batch,
    refused whole if any record in it is stamped ``REFUSED``."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker)
        self.broker = broker
        self.queued: dict[int, list[tuple[list[OutRecord], asyncio.Future[Ack]]]] = {}
        self.batches = 0  # broker batches sent

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Ack]:
        return self._queue(partition or 0, [(key, value, headers, timestamp_ms)])

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        return [(len(records), self._queue(partition, list(records)))]

    def _queue(self, partition: int, records: list[OutRecord]) -> asyncio.Future[Ack]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Ack] = loop.create_future()
        if not self.queued:
            loop.call_soon(self._send_queued)
        self.queued.setdefault(partition, []).append((records, future))
        return future

    def _send_queued(self) -> None:
        queued, self.queued = self.queued, {}
        for partition, sends in queued.items():
            self.batches += 1
            if any(r[3] == REFUSED for records, _ in sends for r in records):
                for _, future in sends:
                    future.set_exception(RecordRejected("INVALID_TIMESTAMP"))
                continue
            for records, future in sends:
                for key, value, headers, ts in records:
                    ack = self.broker.append(
                        TOPIC, value, key=key, headers=headers, partition=partition, timestamp_ms=ts
                    )
                future.set_result(ack)


# Per send: published (batched by the publisher) or sent alone; refused or not.
sends = st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(plan=sends, checkpoints=st.integers(1, 3))
def test_only_the_records_refused_alone_are_handed_on_and_the_rest_are_written(
    plan: list[tuple[bool, bool]], checkpoints: int
) -> None:
    async def run() -> tuple[list[object], list[bytes]]:
        broker = MemoryBroker()
        broker.create_topic(TOPIC, 1)
        producer = _BatchingProducer(broker)
        rejected: list[object] = []

        async def on_rejected(origin: object, exc: RecordRejected) -> None:
            rejected.append(origin)

        async def one_partition(topic: str) -> int:
            return 1

        publisher = Publisher(producer, on_rejected=on_rejected, partition_count=one_partition)
        for n, (published, refused) in enumerate(plan):
            value, ts = f"v{n}".encode(), REFUSED if refused else n
            if published:
                publisher.publish(TOPIC, value, b"k", (), f"o{n}", ts)
            else:
                await publisher.send_bytes(
                    TOPIC, value, key=b"k", partition=0, timestamp_ms=ts, origin=f"o{n}"
                )
            if n % checkpoints == 0:
                await asyncio.sleep(0)  # a turn of the loop: what is queued goes
        await publisher.await_acks()
        assert publisher.all_acked()
        return rejected, [m.value or b"" for m in broker.messages(TOPIC, 0)]

    rejected, written = asyncio.run(run())
    assert sorted(map(str, rejected)) == sorted(f"o{n}" for n, (_, r) in enumerate(plan) if r)
    assert sorted(written) == sorted(f"v{n}".encode() for n, (_, r) in enumerate(plan) if not r)
