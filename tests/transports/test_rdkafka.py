"""The librdkafka adapter's own behaviour (``kafka://...?client=rdkafka``).

What every transport must do is in the conformance suite, which runs on this client too;
this file covers what only this adapter has: choosing it, its settings, error mapping,
and that its blocking calls stay off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Message as RdMessage

from flowkit.errors import BrokerUnavailable, CommitFailed, ConfigurationError, TransportError
from flowkit.records import Message, TopicPartition
from flowkit.transports import TopicSpec, transport_from_url
from flowkit.transports.rdkafka import RdkafkaTransport, map_rdkafka_errors
from flowkit.transports.rdkafka.batches import Held, batches_of, runs_of
from flowkit.transports.rdkafka.consumer import _watermarks
from flowkit.transports.rdkafka.settings import client_config
from flowkit.transports.rdkafka.transport import _LIBRDKAFKA_LOG


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_the_url_chooses_the_client() -> None:
    t = transport_from_url("kafka://127.0.0.1:1?client=rdkafka&linger_ms=7&acks=1")
    assert isinstance(t, RdkafkaTransport)
    assert t.url == "kafka://127.0.0.1:1?client=rdkafka"
    producer = client_config(t._settings, "producer")
    assert producer["linger.ms"] == 7 and producer["acks"] == 1
    assert type(transport_from_url("kafka://127.0.0.1:1")).__name__ == "KafkaTransport"


def test_settings_map_to_librdkafka_properties_by_role() -> None:
    t = RdkafkaTransport(
        ["127.0.0.1:1"],
        compression_type="zstd",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        fetch_max_wait_ms=20,
    )
    group = t.consumer(group_id="g")._config
    assert group["session.timeout.ms"] == 6000 and group["fetch.wait.max.ms"] == 20
    assert group["fetch.queue.backoff.ms"] == 10  # flowkit's default, not librdkafka's
    assert group["partition.assignment.strategy"] == "range"
    assert group["enable.auto.commit"] is False
    assigned = t.consumer(group_id=None)._config
    assert "session.timeout.ms" not in assigned and assigned["fetch.wait.max.ms"] == 20
    producer = t.producer()._config
    assert producer["compression.type"] == "zstd" and producer["acks"] == "all"
    assert producer["partitioner"] == "murmur2_random"
    assert "fetch.wait.max.ms" not in producer


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {"linger": 5},
            "unknown rdkafka setting 'linger' (known: acks, broker_timeout, client_id,",
        ),
        ({"client": "librdkafka"}, "unknown Kafka client 'librdkafka'"),
        ({"linger_ms": "5ms"}, "linger_ms='5ms': expected an int >= 0"),
        ({"acks": 2}, "acks=2: expected one of"),
        ({"session_timeout_ms": 1000, "heartbeat_interval_ms": 1000}, "heartbeat_interval_ms"),
        ({"ssl_cafile": "ca.pem"}, "need security_protocol SSL"),
    ],
)
def test_bad_settings_are_one_line_errors(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        transport_from_url("kafka://127.0.0.1:1", **{"client": "rdkafka", **settings})
    assert named in str(info.value) and "\n" not in str(info.value)


def test_librdkafka_errors_map_to_the_flowkit_tree() -> None:
    with pytest.raises(BrokerUnavailable), map_rdkafka_errors():
        raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"))
    with pytest.raises(CommitFailed), map_rdkafka_errors():
        raise KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS, "rebalancing"))
    with pytest.raises(CommitFailed), map_rdkafka_errors(commit=True):
        raise KafkaException(KafkaError(KafkaError.UNKNOWN, "odd"))


def rd(partition: int, offset: int, error: KafkaError | None = None, topic: str = "t") -> Any:
    return RdMessage(
        topic=topic,
        partition=partition,
        offset=offset,
        key=b"k",
        value=b"v%d" % offset,
        timestamp=(1, 1000 + offset),
        headers=[("h", b"1")] if offset == 2 else None,
        error=error,
    )


def test_librdkafka_messages_are_filed_per_partition_in_order() -> None:
    eof = KafkaError(KafkaError._PARTITION_EOF)
    got = batches_of([rd(0, 1), rd(1, 7), rd(0, 2), rd(1, 8, eof), rd(0, 3)])
    assert list(got) == [TopicPartition("t", 0), TopicPartition("t", 1)]
    run = got[TopicPartition("t", 0)]
    assert [run.value_of(r) for r in run.raw] == [b"v1", b"v2", b"v3"]  # what the loop reads
    assert list(run) == [
        Message("t", 0, 1, 1001, b"k", b"v1", ()),
        Message("t", 0, 2, 1002, b"k", b"v2", (("h", b"1"),)),
        Message("t", 0, 3, 1003, b"k", b"v3", ()),
    ]
    assert run[-1] is run[2] and run[-1].offset == 3  # each record made a Message once
    assert run[0:2] == list(run)[0:2]
    with pytest.raises(IndexError):
        run[-4]
    assert [m.offset for m in got[TopicPartition("t", 1)]] == [7]  # the end-of-partition skipped
    with pytest.raises(TransportError, match="UNKNOWN_TOPIC_OR_PART"):
        batches_of([rd(0, 1), rd(0, 2, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))])
    assert batches_of([]) == {} and batches_of([rd(0, 1, eof)]) == {}


def test_partitions_of_the_same_number_of_two_topics_stay_apart() -> None:
    got = batches_of([rd(0, 1), rd(0, 5, topic="u"), rd(0, 2), rd(1, 3, topic="u")])
    assert {tp: [m.offset for m in run] for tp, run in got.items()} == {
        TopicPartition("t", 0): [1, 2],
        TopicPartition("u", 0): [5],
        TopicPartition("u", 1): [3],
    }


async def test_unreachable_broker_is_broker_unavailable() -> None:
    t = RdkafkaTransport(["127.0.0.1:9"], connect_timeout=1.5)
    try:
        with pytest.raises(BrokerUnavailable, match=r"no Kafka broker at 127\.0\.0\.1:9"):
            await t.producer().start()
    finally:
        await t.aclose()


@pytest.mark.kafka
async def test_a_waiting_getmany_leaves_the_event_loop_free(kafka_bootstrap: str) -> None:
    t = RdkafkaTransport([kafka_bootstrap], fetch_max_wait_ms=20)
    try:
        topic = unique("rd")
        await t.create_topics([TopicSpec(topic, 1)])
        consumer = t.consumer(group_id=None)
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.getmany(0, 10)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        assert await consumer.getmany(1.0, 10) == {}  # nothing to read: waits 1 s in a thread
        waited = time.monotonic() - started
        ticker.cancel()
        assert ticks >= 3, waited  # the loop kept running meanwhile
        getter = asyncio.create_task(consumer.getmany(30.0, 10))
        await asyncio.sleep(0.1)
        await consumer.aclose()  # ends the waiting getmany
        assert await asyncio.wait_for(getter, 5) == {}
    finally:
        await t.aclose()


@pytest.mark.kafka
async def test_commit_outside_a_group_and_after_close_raise(kafka_bootstrap: str) -> None:
    t = RdkafkaTransport([kafka_bootstrap])
    try:
        with pytest.raises(CommitFailed, match="no group_id"):
            await t.consumer(group_id=None).commit({TopicPartition("x", 0): 1})
        consumer = t.consumer(group_id=unique("g"))
        await consumer.aclose()
        with pytest.raises(CommitFailed, match="closed"):
            await consumer.commit({TopicPartition("x", 0): 1})
    finally:
        await t.aclose()


class _LeaderSoon:
    """get_watermark_offsets of a topic created a moment ago: no leader, then (10, 20)."""

    def __init__(self, failures: int, code: int = KafkaError.NOT_LEADER_FOR_PARTITION) -> None:
        self.failures = failures
        self.code = code
        self.calls = 0

    def get_watermark_offsets(self, ktp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return (10, 20)


def test_watermarks_are_asked_again_while_the_leader_is_not_known() -> None:
    # Raised out of the rebalance callback, this once killed the consume thread for good.
    kafka = _LeaderSoon(2)
    assert _watermarks(kafka, None, 5.0) == (10, 20)
    assert kafka.calls == 3


def test_watermarks_raise_other_errors_at_once() -> None:
    kafka = _LeaderSoon(1, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        _watermarks(kafka, None, 5.0)
    assert kafka.calls == 1


def test_a_budget_hands_over_each_partition_in_order_a_fetch_at_a_time() -> None:
    # rd() records: key b"k" and value b"v<offset>", 3 to 4 bytes each.
    held = Held(budget=10)
    t0 = TopicPartition("t", 0)

    def offsets(got: dict[TopicPartition, Any]) -> dict[int, list[int]]:
        return {tp.partition: [m.offset for m in run] for tp, run in got.items()}

    assert offsets(held.take(runs_of([rd(0, 1), rd(0, 2), rd(1, 7), rd(0, 3), rd(0, 4)]))) == {
        0: [1, 2, 3],
        1: [7],
    }
    assert held.count == 1
    assert offsets(held.take(runs_of([rd(0, 5), rd(1, 8)]))) == {0: [4, 5], 1: [8]}
    assert held.count == 0 and offsets(held.take({})) == {}
    huge = RdMessage(topic="t", partition=0, offset=6, key=None, value=b"x" * 100)
    assert offsets(held.take({t0: [huge, rd(0, 7)]})) == {0: [6]}  # one record at least
    held.drop([t0])  # assigned again: read from the committed offset, not from here
    assert held.count == 0 and held.runs == {}


class _Owned:
    """A rebalance listener that only keeps what the group gave this consumer."""

    def __init__(self) -> None:
        self.owned: set[TopicPartition] = set()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.owned -= revoked

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.owned |= assigned


@pytest.mark.kafka
async def test_exactly_once_batches_hold_at_most_a_fetch_of_a_partition(
    kafka_bootstrap: str,
) -> None:
    # librdkafka reads far ahead (queued.max.messages.kbytes); an exactly-once checkpoint
    # waits for every batch handed to the agents, so one getmany must not hand over all
    # of that: at most max_partition_fetch_bytes of a partition, as a fetch on aiokafka.
    budget = 1000
    t = RdkafkaTransport(
        [kafka_bootstrap],
        max_partition_fetch_bytes=budget,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    try:
        topic = unique("rd-eos")
        await t.create_topics([TopicSpec(topic, 2)])
        producer = t.producer()
        values = {p: [b"%d:%03d:" % (p, n) + b"x" * 90 for n in range(200)] for p in (0, 1)}
        acks = [
            await producer.send(topic, v, key=b"k", partition=p) for p in (0, 1) for v in values[p]
        ]
        await asyncio.gather(*acks)
        t.transactional_producer(transactional_id=unique("tx"))  # exactly-once from here
        consumer = t.consumer(group_id=unique("g"))
        listener = _Owned()
        consumer.subscribe([topic], listener)
        got: dict[int, list[bytes]] = {0: [], 1: []}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 400:
            assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
            for tp, batch in (await consumer.getmany(0.5, 10_000)).items():
                size = sum(len(m.value or b"") + len(m.key or b"") for m in batch)
                assert len(batch) == 1 or size <= budget, (tp, len(batch), size)
                got[tp.partition] += [m.value or b"" for m in batch]
                assert consumer.position(tp) == batch[-1].offset + 1
            await asyncio.sleep(0.05)  # librdkafka meanwhile reads ahead
        assert got == values  # each record once, in order
        assert listener.owned == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    finally:
        await t.aclose()


def test_a_failed_broker_connection_is_left_to_the_broker_watch() -> None:
    # librdkafka's FAIL lines (a connection refused, reset or timed out) are not logged:
    # error_cb hints the broker watch, which reports an outage once, if it lasts.
    def line(message: str) -> logging.LogRecord:
        return _LIBRDKAFKA_LOG.makeRecord(
            _LIBRDKAFKA_LOG.name, logging.ERROR, __file__, 1, message, None, None
        )

    failed = "FAIL [p#producer-2] [thrd:127.0.0.1:1/bootstrap]: Connect to 127.0.0.1:1 failed"
    assert not _LIBRDKAFKA_LOG.filter(line(failed))
    assert _LIBRDKAFKA_LOG.filter(line("SASL [p#producer-2] [thrd:main]: mechanism refused"))
