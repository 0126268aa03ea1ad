"""Group-less Kafka reads built straight from the fetched record batches (draining.py):
the same records, in the same order, as aiokafka's own path, at any ``max_records``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from flowkit.records import Message, TopicPartition
from flowkit.transports import TopicSpec
from flowkit.transports.kafka import KafkaConsumer, KafkaTransport
from flowkit.transports.kafka.draining import usable

pytestmark = pytest.mark.kafka


@pytest.fixture
async def transport(kafka_bootstrap: str) -> AsyncIterator[KafkaTransport]:
    t = KafkaTransport([kafka_bootstrap], fetch_max_wait_ms=20)
    try:
        yield t
    finally:
        await t.aclose()


async def read_all(
    consumer: KafkaConsumer, tp: TopicPartition, count: int, max_records: int
) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + 10
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count}"
        batches = await consumer.getmany(0.05, max_records)
        assert sum(len(ms) for ms in batches.values()) <= max_records
        for messages in batches.values():
            got.extend(messages)
        if batches:
            # What a fetch brought beyond max_records is not read yet.
            assert consumer.position(tp) == got[-1].offset + 1
            if len(got) == max_records:
                consumer.assign([tp])  # kept partitions keep their position
    return got


async def test_drained_records_equal_aiokafkas_at_any_batch_size(
    transport: KafkaTransport,
) -> None:
    topic = f"drain-{uuid.uuid4().hex[:10]}"
    await transport.create_topics([TopicSpec(topic, 1)])
    producer = transport.producer()
    sent = []
    for chunk in range(4):  # four record batches
        records = [
            (
                f"k{i}".encode(),
                None if i % 17 == 0 else f"v{i}".encode(),  # tombstones too
                (("h", f"{i}".encode()), ("h", b"")) if i % 5 == 0 else (),
                1_700_000_000_000 + i,
            )
            for i in range(chunk * 60, chunk * 60 + 60)
        ]
        for _, ack in await producer.send_batch(topic, 0, records):
            await ack
        sent.extend(records)
    await producer.aclose()

    tp = TopicPartition(topic, 0)
    results = []
    for fast, max_records in ((True, 7), (True, 1000), (False, 1000)):
        consumer = transport.consumer(group_id=None, client_id="drain-test")
        await consumer.start()
        assert consumer._drainer is not None  # this aiokafka's fetcher is one it reads
        if not fast:
            consumer._drainer = None
        consumer.assign([tp])
        got = await read_all(consumer, tp, len(sent), max_records)
        assert consumer.position(tp) == len(sent)
        await consumer.aclose()
        results.append(got)
    assert results[0] == results[1] == results[2]  # aiokafka's own path last
    assert [(m.offset, m.key, m.value, m.headers, m.timestamp) for m in results[0]] == [
        (i, key, value, headers, ts) for i, (key, value, headers, ts) in enumerate(sent)
    ]


class KnownFetcher:
    """The parts of aiokafka's fetcher that draining.py reads."""

    _records: dict[object, object] = {}  # noqa: RUF012
    _wait_consume_future = None
    _check_crcs = True

    def _notify(self, future: object) -> None:
        pass


def test_group_members_read_committed_and_unknown_fetchers_use_aiokafkas_path() -> None:
    kafka = SimpleNamespace(_fetcher=KnownFetcher())
    assert usable(kafka, {"group_id": None})
    assert not usable(kafka, {"group_id": "members"})
    assert not usable(kafka, {"group_id": None, "isolation_level": "read_committed"})
    assert not usable(SimpleNamespace(_fetcher=object()), {"group_id": None})
