"""Group-less Kafka reads built straight from the fetched record batches (draining.py):
the same records, in the same order, as aiokafka's own path, at any ``max_records``."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import aiokafka
import pytest

from flowkit.records import Message, TopicPartition
from flowkit.transports import TopicSpec
from flowkit.transports.kafka import KafkaConsumer, KafkaTransport
from flowkit.transports.kafka.draining import usable

from .conftest import Recorder

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
    _in_flight: set[object] = set()  # noqa: RUF012
    _wait_consume_future = None
    _check_crcs = True

    def _notify(self, future: object) -> None:
        pass


def known(fetcher: object) -> SimpleNamespace:
    """An aiokafka consumer as far as draining.py reads it."""
    return SimpleNamespace(
        _fetcher=fetcher,
        _coordinator=SimpleNamespace(check_errors=lambda: None),
        _subscription=SimpleNamespace(fetch_context=lambda: None),
    )


def test_read_committed_and_unknown_aiokafka_parts_use_aiokafkas_path() -> None:
    assert usable(known(KnownFetcher()), {"group_id": None})
    assert usable(known(KnownFetcher()), {"group_id": "members"})
    assert not usable(
        known(KnownFetcher()), {"group_id": None, "isolation_level": "read_committed"}
    )
    assert not usable(known(object()), {"group_id": "members"})
    assert not usable(SimpleNamespace(_fetcher=KnownFetcher()), {"group_id": "members"})


def test_an_unchecked_aiokafka_release_uses_aiokafkas_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiokafka

    monkeypatch.setattr(aiokafka, "__version__", "0.15.0")
    assert not usable(known(KnownFetcher()), {"group_id": "members"})


async def test_group_members_drain_the_same_records_across_a_rebalance(
    kafka_bootstrap: str,
) -> None:
    # Per partition, what member a read before the rebalance (it commits its positions
    # when revoked, kept records included as not read) and what both read after it are
    # exactly the records sent: none lost to a dropped leftover, none read twice.
    transports = [
        KafkaTransport(
            [kafka_bootstrap],
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
            fetch_max_wait_ms=20,
        )
        for _ in range(2)
    ]
    topic = f"drain-group-{uuid.uuid4().hex[:10]}"
    await transports[0].create_topics([TopicSpec(topic, 2)])
    producer = transports[0].producer()
    sent: dict[int, list[tuple[bytes, bytes]]] = {0: [], 1: []}
    for chunk in range(3):  # three record batches a partition
        for p in (0, 1):
            records = [
                (b"k%d" % i, b"p%d-v%d" % (p, i), (), 1_700_000_000_000 + i)
                for i in range(chunk * 50, chunk * 50 + 50)
            ]
            for _, ack in await producer.send_batch(topic, p, records):
                await ack
            sent[p].extend((k, v) for k, v, _, _ in records)
    await producer.aclose()
    try:
        group = f"g-{uuid.uuid4().hex[:10]}"
        events: list[tuple[str, str, TopicPartition]] = []
        a, b = Recorder("a", events), Recorder("b", events)
        a.consumer = ca = transports[0].consumer(group_id=group, client_id="a")
        b.consumer = cb = transports[1].consumer(group_id=group, client_id="b")
        await ca.start()
        assert ca._drainer is not None  # this aiokafka is one draining.py reads
        ca.subscribe([topic], a)
        got: dict[int, list[Message]] = {0: [], 1: []}

        sizes = itertools.cycle((7, 64, 1000))  # a batch size per read, kept records too

        async def read(consumer: KafkaConsumer) -> None:
            max_records = next(sizes)
            batches = await consumer.getmany(0.05, max_records)
            assert sum(len(ms) for ms in batches.values()) <= max_records
            for tp, messages in batches.items():
                assert tp in consumer.assignment()
                got[tp.partition].extend(messages)
                assert consumer.position(tp) == messages[-1].offset + 1

        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < 100:  # a third, and records kept
            assert time.monotonic() < deadline
            await read(ca)
        await cb.start()
        cb.subscribe([topic], b)
        while sum(map(len, got.values())) < 300 or not (a.owned and b.owned):
            assert time.monotonic() < deadline
            await asyncio.gather(read(ca), read(cb))
        for p in (0, 1):
            assert [(m.offset, m.key, m.value) for m in got[p]] == [
                (i, k, v) for i, (k, v) in enumerate(sent[p])
            ]
        assert ("revoked", "a", TopicPartition(topic, 0)) in events
        await ca.aclose()
        await cb.aclose()
    finally:
        for t in transports:
            await t.aclose()


async def test_kept_records_of_a_paused_or_moved_partition_are_read_again(
    transport: KafkaTransport,
) -> None:
    # As aiokafka drops a buffered fetch of a paused partition (and of one moved by a
    # seek), kept records are dropped; a paused partition is read again from the first
    # of them once resumed, a moved one from where it was moved to.
    topic = f"drain-pause-{uuid.uuid4().hex[:10]}"
    await transport.create_topics([TopicSpec(topic, 1)])
    producer = transport.producer()
    records = [(b"k%d" % i, b"v%d" % i, (), 1_700_000_000_000 + i) for i in range(100)]
    for _, ack in await producer.send_batch(topic, 0, records):
        await ack
    await producer.aclose()
    tp, ktp = TopicPartition(topic, 0), aiokafka.TopicPartition(topic, 0)
    consumer = transport.consumer(group_id=None, client_id="drain-pause")
    await consumer.start()
    assert consumer._drainer is not None
    consumer.assign([tp])
    got: list[Message] = []
    deadline = time.monotonic() + 10
    while not got:
        assert time.monotonic() < deadline
        got.extend(m for ms in (await consumer.getmany(0.05, 7)).values() for m in ms)
    assert consumer._drainer.position(tp) == 7  # the rest of the fetch is kept
    consumer._kafka.pause(ktp)
    assert consumer.position(tp) == 7
    assert await consumer.getmany(0.05, 7) == {}
    consumer._kafka.resume(ktp)
    while len(got) < 30:
        assert time.monotonic() < deadline
        got.extend(m for ms in (await consumer.getmany(0.05, 7)).values() for m in ms)
    before = len(got)
    consumer._kafka.seek(ktp, 90)  # records kept from before are not handed out
    while got[-1].offset != 99:
        assert time.monotonic() < deadline
        got.extend(m for ms in (await consumer.getmany(0.05, 7)).values() for m in ms)
    assert [m.offset for m in got] == [*range(before), *range(90, 100)]
    assert [m.value for m in got[:3]] == [b"v0", b"v1", b"v2"]
    await consumer.aclose()


async def test_the_next_fetch_is_asked_for_before_records_are_handed_out(
    transport: KafkaTransport,
) -> None:
    # A worker processes what getmany hands out in one step of the event loop; the fetch
    # for what comes next must be on its way by then, not asked for once that is done.
    topic = f"drain-ahead-{uuid.uuid4().hex[:10]}"
    await transport.create_topics([TopicSpec(topic, 2)])
    producer = transport.producer()
    for partition in (0, 1):
        records = [(b"k%d" % i, b"v%d" % i, (), 1_700_000_000_000 + i) for i in range(50)]
        for _, ack in await producer.send_batch(topic, partition, records):
            await ack
    await producer.aclose()
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    consumer = transport.consumer(group_id=None, client_id="drain-ahead")
    await consumer.start()
    assert consumer._drainer is not None
    consumer.assign(tps)
    fetcher = consumer._kafka._fetcher
    deadline = time.monotonic() + 10
    while not fetcher._records:  # a fetch has come back, not read yet
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    first = await consumer.getmany(1.0, 1)
    assert sum(len(ms) for ms in first.values()) == 1
    # The whole fetch was read (what one call could not take is kept), and the fetcher
    # has already sent its next request.
    assert not fetcher._records
    assert fetcher._in_flight
    got = {tp: [m.offset for m in ms] for tp, ms in first.items()}
    while sum(len(offsets) for offsets in got.values()) < 100:
        assert time.monotonic() < deadline
        for tp, ms in (await consumer.getmany(0.05, 30)).items():
            got.setdefault(tp, []).extend(m.offset for m in ms)
    assert got == {tp: list(range(50)) for tp in tps}
    await consumer.aclose()
