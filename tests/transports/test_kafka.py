"""The Kafka adapter's own behaviour, against Tansu (or ``$FLOWKIT_TEST_KAFKA``).

What every transport must do is in the conformance suite; this file covers what only the
Kafka adapter has: settings, error mapping, topic admin, groups across a real broker.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiokafka.structs import TopicPartition as KafkaTP

from flowkit.errors import (
    BrokerUnavailable,
    CommitFailed,
    ConfigurationError,
    RecordRejected,
    TransportError,
)
from flowkit.partitioning import partition_for_key
from flowkit.records import Message, TopicPartition
from flowkit.transports import TopicSpec, transport_from_url
from flowkit.transports.kafka import KafkaConsumer, KafkaTransport, map_kafka_errors
from tests.kafka_broker import TansuBroker

pytestmark = pytest.mark.kafka

FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def transport(kafka_bootstrap: str) -> AsyncIterator[KafkaTransport]:
    t = KafkaTransport([kafka_bootstrap], **FAST_GROUP, fetch_max_wait_ms=20)
    try:
        yield t
    finally:
        await t.aclose()


async def until(
    predicate: Callable[[], bool], step: Callable[[], Awaitable[Any]], deadline: float
) -> None:
    """Run ``step`` until ``predicate`` holds, failing after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not predicate():
        assert time.monotonic() < end, "timed out"
        await step()


async def drain(
    consumer: KafkaConsumer, count: int, deadline: float = 10.0
) -> dict[TopicPartition, list[Message]]:
    got: dict[TopicPartition, list[Message]] = {}

    async def step() -> None:
        for tp, messages in (await consumer.getmany(0.2, 1000)).items():
            got.setdefault(tp, []).extend(messages)

    await until(lambda: sum(map(len, got.values())) >= count, step, deadline)
    return got


# --- settings and errors -------------------------------------------------------------------


def test_settings_pass_through_to_the_clients() -> None:
    t = transport_from_url(
        "kafka://127.0.0.1:1,127.0.0.1:2",
        client_id="app",
        acks=1,
        compression_type="gzip",
        linger_ms=7,
        max_batch_size=1 << 16,
        fetch_max_wait_ms=20,
        fetch_max_bytes=1 << 20,
        max_partition_fetch_bytes=1 << 18,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_interval_ms=60000,
        group_instance_id="worker-1",
        request_timeout_ms=5000,
    )
    assert isinstance(t, KafkaTransport)
    assert t.url == "kafka://127.0.0.1:1,127.0.0.1:2"
    producer = t.producer()._options
    assert producer["acks"] == 1 and producer["linger_ms"] == 7
    assert producer["compression_type"] == "gzip" and producer["max_batch_size"] == 1 << 16
    assert producer["client_id"] == "app" and producer["request_timeout_ms"] == 5000
    assert "fetch_max_wait_ms" not in producer and "group_instance_id" not in producer
    consumer = t.consumer(group_id="g", client_id="mine")._options
    assert consumer["client_id"] == "app"  # the client_id setting names every client
    assert consumer["fetch_max_wait_ms"] == 20 and consumer["max_partition_fetch_bytes"] == 1 << 18
    assert consumer["session_timeout_ms"] == 6000 and consumer["group_instance_id"] == "worker-1"
    assert consumer["enable_auto_commit"] is False and consumer["auto_offset_reset"] == "earliest"
    assert "linger_ms" not in consumer
    # Static membership is for group members only.
    assert "group_instance_id" not in t.consumer(group_id=None)._options


def test_defaults_suit_a_stream_processor() -> None:
    t = KafkaTransport(["127.0.0.1:1"])
    consumer, producer = t.consumer(group_id="g")._options, t.producer()._options
    assert consumer["fetch_max_wait_ms"] <= 100
    assert consumer["max_partition_fetch_bytes"] >= 1 << 20
    assert producer["acks"] == "all" and producer["linger_ms"] <= 10
    assert "enable_idempotence" not in producer and "transactional_id" not in producer


def test_what_the_worker_can_read_it_can_dead_letter() -> None:
    from structlog.testing import capture_logs

    from flowkit.transports.kafka.settings import DEAD_LETTER_ROOM

    fetch = 2 << 20
    with capture_logs() as logs:
        producer = KafkaTransport(["127.0.0.1:1"], max_partition_fetch_bytes=fetch).producer()
    assert producer._options["max_request_size"] == fetch + DEAD_LETTER_ROOM
    assert producer.max_record_bytes is not None and producer.max_record_bytes > fetch
    assert logs == []
    with capture_logs() as logs:
        KafkaTransport(["127.0.0.1:1"], max_partition_fetch_bytes=fetch, max_request_size=fetch)
    [entry] = logs
    assert entry["log_level"] == "warning"
    assert "max_request_size is below max_partition_fetch_bytes" in entry["event"]


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"fetch_max_wait": 10}, "fetch_max_wait"),
        ({"linger_ms": -1}, "linger_ms"),
        ({"linger_ms": "5"}, "linger_ms"),
        ({"acks": 2}, "acks"),
        ({"compression_type": "brotli"}, "compression_type"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"session_timeout_ms": 1000, "heartbeat_interval_ms": 1000}, "heartbeat_interval_ms"),
        ({"ssl_cafile": "/nonexistent.pem"}, "security_protocol"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent.pem"}, "ssl"),
        ({"security_protocol": "SASL_PLAINTEXT"}, "sasl_plain_username"),
    ],
)
def test_bad_settings_raise_configuration_error(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named) as info:
        transport_from_url("kafka://127.0.0.1:9092", **settings)
    assert "\n" not in str(info.value)


def test_map_kafka_errors_hides_aiokafka_types() -> None:
    import aiokafka.errors as kerr

    cases = [
        (kerr.KafkaConnectionError("closed"), BrokerUnavailable, False),
        (kerr.NodeNotReadyError("111"), BrokerUnavailable, False),
        (kerr.CommitFailedError("rebalanced"), CommitFailed, False),
        (kerr.RebalanceInProgressError(), CommitFailed, False),
        (kerr.IllegalStateError("not assigned"), CommitFailed, True),
        (kerr.UnknownTopicOrPartitionError(), TransportError, False),
        (kerr.MessageSizeTooLargeError("too big"), RecordRejected, False),
        (kerr.TopicAuthorizationFailedError(), RecordRejected, False),
        (kerr.KafkaTimeoutError(), BrokerUnavailable, False),
        (kerr.IllegalOperation("Requires group_id"), TransportError, False),
    ]
    for exc, expected, commit in cases:
        with pytest.raises(expected) as info, map_kafka_errors(commit=commit):
            raise exc
        assert type(info.value) is expected
        assert info.value.__cause__ is exc
    with pytest.raises(KeyError), map_kafka_errors():  # not aiokafka's: passes through
        raise KeyError("x")


class _Answer:
    """An OffsetFetch answer with a group-level error code (Kafka's, v2 and later)."""

    def __init__(self, error_code: int) -> None:
        self.error_code = error_code


class _Coordinator:
    """aiokafka's group coordinator as ``guard`` sees it: it sends requests and can be
    marked dead."""

    def __init__(self, error_code: int) -> None:
        self.error_code = error_code
        self.dead = 0

    async def _send_req(self, request: Any) -> _Answer:
        return _Answer(self.error_code)

    def coordinator_dead(self) -> None:
        self.dead += 1


class _Consumer:
    def __init__(self, coordinator: _Coordinator) -> None:
        self._coordinator = coordinator


async def test_a_group_level_offset_fetch_error_is_raised_not_read_as_no_offsets() -> None:
    """Apache Kafka answers "loading" for the whole group right after a restart; aiokafka
    would read the empty partitions as "nothing committed" (flowkit.transports.kafka.loading)."""
    import aiokafka.errors as kerr
    from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest

    from flowkit.transports.kafka.loading import guard

    fetch = OffsetFetchRequest("g", [("t", [0])])
    loading = _Coordinator(kerr.GroupLoadInProgressError.errno)
    assert guard(_Consumer(loading))
    with pytest.raises(kerr.GroupLoadInProgressError) as raised:
        await loading._send_req(fetch)
    assert raised.value.retriable  # aiokafka retries it after its backoff
    moved = _Coordinator(kerr.NotCoordinatorForGroupError.errno)
    assert guard(_Consumer(moved))
    with pytest.raises(kerr.NotCoordinatorForGroupError):
        await moved._send_req(fetch)
    assert moved.dead == 1  # asked where the group is again, as for a partition's error
    # Answers without a group-level error, and other requests, pass as they are.
    fine = _Coordinator(0)
    assert guard(_Consumer(fine))
    assert (await fine._send_req(fetch)).error_code == 0
    other = _Coordinator(kerr.GroupLoadInProgressError.errno)
    assert guard(_Consumer(other))
    commit = OffsetCommitRequest("g", 1, "m", -1, [("t", [(0, 5, "")])])
    assert (await other._send_req(commit)).error_code == kerr.GroupLoadInProgressError.errno
    assert not guard(object())  # no coordinator to guard: nothing done


async def test_unreachable_broker_raises_broker_unavailable_within_the_deadline() -> None:
    t = KafkaTransport(["127.0.0.1:9"], connect_timeout=0.5)
    # Each gives up at the deadline: without one, these would wait for ever.
    with pytest.raises(BrokerUnavailable, match=r"no Kafka broker at 127\.0\.0\.1:9 \("):
        await asyncio.wait_for(t.producer().start(), 30)
    with pytest.raises(BrokerUnavailable):
        await asyncio.wait_for(t.consumer(group_id="g").start(), 30)
    with pytest.raises(BrokerUnavailable):
        await asyncio.wait_for(t.partition_count("x"), 30)
    await t.aclose()
    await t.aclose()  # idempotent


# --- topics --------------------------------------------------------------------------------


async def test_create_topics_creates_what_is_missing_and_rejects_a_mismatch(
    transport: KafkaTransport,
) -> None:
    a, b = unique("a"), unique("b")
    assert await transport.partition_count(a) is None
    assert await transport.partition_count(a) is None  # asking did not create it
    await transport.create_topics([TopicSpec(a, 3), TopicSpec(b, 2, compacted=True)])
    assert await transport.partition_count(a) == 3
    assert await transport.partition_count(b) == 2
    await transport.create_topics([TopicSpec(a, 3)])  # exists already: fine
    with pytest.raises(ConfigurationError) as info:
        await transport.create_topics([TopicSpec(a, 8)])
    assert str(info.value) == f"topic {a!r} exists with 3 partitions, the app declares 8"
    admin = transport._admin  # opened by the calls above
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    (described,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, b)])
    configs = {entry[0]: entry[1] for entry in described.resources[0][4]}
    assert configs.get("cleanup.policy") == "compact"


# --- produce and consume -------------------------------------------------------------------


async def test_round_trip_keeps_keys_headers_tombstones_and_timestamps(
    transport: KafkaTransport,
) -> None:
    topic = unique("rt")
    await transport.create_topics([TopicSpec(topic, 1)])
    producer = transport.producer()
    await producer.start()
    headers = (("a", b"1"), ("a", b"2"), ("empty", b""))
    sent = [
        await producer.send(topic, b"v0", key=b"k0", headers=headers, timestamp_ms=1_000),
        await producer.send(topic, None, key=b"k0", timestamp_ms=2_000),
        await producer.send(topic, b"v2"),
    ]
    await producer.flush()
    acks = [await ack for ack in sent]
    assert [(a.topic, a.partition, a.offset) for a in acks] == [(topic, 0, i) for i in range(3)]

    consumer = transport.consumer(group_id=None)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    got = (await drain(consumer, 3))[tp]
    assert type(next(iter(got))) is Message
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == [
        (0, b"k0", b"v0", headers),
        (1, b"k0", None, ()),
        (2, None, b"v2", ()),
    ]
    assert [m.timestamp for m in got[:2]] == [1_000, 2_000]
    assert abs(got[2].timestamp - time.time() * 1000) < 60_000
    assert consumer.position(tp) == 3 and consumer.highwater(tp) == 3


async def test_keyed_records_land_where_partition_for_key_says(transport: KafkaTransport) -> None:
    topic = unique("keys")
    await transport.create_topics([TopicSpec(topic, 5)])
    producer = transport.producer()
    await producer.start()
    for i in range(40):
        key = f"user-{i}".encode()
        ack = await (await producer.send(topic, b"x", key=key))
        assert ack.partition == partition_for_key(key, 5)


async def test_assign_before_start_and_position(transport: KafkaTransport) -> None:
    topic = unique("assign")
    await transport.create_topics([TopicSpec(topic, 2)])
    producer = transport.producer()
    await producer.start()
    for i in range(10):
        await producer.send(topic, str(i).encode(), partition=i % 2)
    await producer.flush()
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = transport.consumer(group_id=None)
    consumer.assign([p0])  # before start: replayed by start
    await consumer.start()
    assert consumer.assignment() == {p0} and consumer.highwater(p0) is None
    assert [m.offset for m in (await drain(consumer, 5))[p0]] == [0, 1, 2, 3, 4]
    assert consumer.position(p0) == 5
    consumer.assign([p0, p1])  # p0 keeps its position
    got = await drain(consumer, 5)
    assert set(got) == {p1} and [m.offset for m in got[p1]] == [0, 1, 2, 3, 4]
    assert consumer.position(p0) == 5
    with pytest.raises(TransportError, match="not assigned"):
        consumer.position(TopicPartition(topic, 7))
    with pytest.raises(CommitFailed, match="group_id"):
        await consumer.commit({p0: 1})
    with pytest.raises(ConfigurationError, match="group_id"):
        await consumer.committed(p0)


async def test_flush_does_not_wait_out_the_linger(kafka_bootstrap: str) -> None:
    async with KafkaTransport([kafka_bootstrap], linger_ms=300_000) as transport:
        producer = transport.producer()
        await producer.start()
        pending = await producer.send(unique("linger"), b"x")
        await asyncio.wait_for(producer.flush(), 60)  # not the five minutes of linger
        assert (await pending).offset == 0


async def test_aclose_ends_a_getmany_waiting_in_another_task(transport: KafkaTransport) -> None:
    topic = unique("idle")
    await transport.create_topics([TopicSpec(topic, 1)])
    consumer = transport.consumer(group_id=None)
    consumer.assign([TopicPartition(topic, 0)])
    await consumer.start()
    waiting = asyncio.create_task(consumer.getmany(300.0, 10))
    await asyncio.sleep(0.1)
    await consumer.aclose()
    assert await asyncio.wait_for(waiting, 60) == {}  # ended by aclose, not its own timeout
    with pytest.raises(TransportError):
        await consumer.getmany(0.1, 10)


async def test_an_assignment_aiokafka_reports_after_the_consumer_closed_is_passed_over(
    transport: KafkaTransport,
) -> None:
    # aiokafka calls the listener in its coordinator task, which can still run while the
    # worker closes the consumer: the client is gone by then, and the call must not fail.
    topic = unique("closing")
    await transport.create_topics([TopicSpec(topic, 1)])
    consumer = transport.consumer(group_id=unique("closing"))
    consumer.subscribe([topic], Recorder())
    await consumer.start()
    bridge = consumer.client._subscription._listener  # aiokafka's, as it calls it
    await consumer.aclose()
    await bridge.on_partitions_assigned({KafkaTP(topic, 0)})
    assert consumer.generation is None


# --- groups --------------------------------------------------------------------------------


class Recorder:
    """A RebalanceListener that remembers what it was told."""

    def __init__(self, consumer: KafkaConsumer | None = None) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []
        self.consumer = consumer
        self.commit_on_revoke: dict[TopicPartition, int] = {}

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", revoked))
        if self.consumer is not None and self.commit_on_revoke:
            await self.consumer.commit(self.commit_on_revoke)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", assigned))


async def test_committed_offsets_are_resumed_by_a_new_consumer(
    transport: KafkaTransport,
) -> None:
    topic, group = unique("commit"), unique("g")
    await transport.create_topics([TopicSpec(topic, 1)])
    producer = transport.producer()
    await producer.start()
    for i in range(10):
        await producer.send(topic, str(i).encode())
    await producer.flush()
    tp = TopicPartition(topic, 0)

    # The first reader takes its partition by assign(), not subscribe(): on Tansu a
    # first-generation member never sends LeaveGroup (aiokafka skips it for generation 0,
    # where Kafka starts at 1), so the next member would wait out its session timeout.
    first = transport.consumer(group_id=group)
    await first.start()
    first.assign([tp])
    got = await drain(first, 10)
    assert [m.offset for m in got[tp]] == list(range(10))
    assert await first.committed(tp) is None
    await first.commit({tp: 6})
    assert await first.committed(tp) == 6
    await first.aclose()
    await first.aclose()

    second = transport.consumer(group_id=group)
    await second.start()
    heard = Recorder()
    second.subscribe([topic], heard)
    assert [m.offset for m in (await drain(second, 4))[tp]] == [6, 7, 8, 9]
    assert heard.events == [("assigned", {tp})] and second.assignment() == {tp}
    await second.aclose()


async def test_two_members_split_the_partitions_and_the_listener_sees_it(
    transport: KafkaTransport,
) -> None:
    topic, group = unique("split"), unique("g")
    await transport.create_topics([TopicSpec(topic, 4)])
    all_tps = {TopicPartition(topic, p) for p in range(4)}
    a = transport.consumer(group_id=group, client_id="a")
    await a.start()
    heard_a = Recorder(a)
    a.subscribe([topic], heard_a)
    await until(lambda: a.assignment() == all_tps, lambda: a.getmany(0.2, 100), 10)
    # A commits from inside its revoke callback, where it still owns the partitions.
    heard_a.commit_on_revoke = {TopicPartition(topic, 0): 0}

    b = transport.consumer(group_id=group, client_id="b")
    await b.start()
    heard_b = Recorder()
    b.subscribe([topic], heard_b)

    async def both() -> None:
        await asyncio.gather(a.getmany(0.2, 100), b.getmany(0.2, 100))

    def split() -> bool:
        mine, theirs = a.assignment(), b.assignment()
        return len(mine) == 2 and len(theirs) == 2 and mine | theirs == all_tps

    await until(split, both, 15)
    assert heard_a.events[0] == ("assigned", all_tps)
    assert heard_a.events[1] == ("revoked", all_tps)
    assert heard_a.events[-1] == ("assigned", a.assignment())
    assert heard_b.events[-1] == ("assigned", b.assignment())
    assert ("revoked", set()) not in heard_b.events  # no empty revocation before joining
    assert await a.committed(TopicPartition(topic, 0)) == 0
    await b.aclose()
    await a.aclose()


async def test_commit_of_a_partition_not_owned_raises_commit_failed(
    transport: KafkaTransport,
) -> None:
    topic, group = unique("nc"), unique("g")
    await transport.create_topics([TopicSpec(topic, 1)])
    consumer = transport.consumer(group_id=group)
    await consumer.start()
    consumer.assign([TopicPartition(topic, 0)])
    with pytest.raises(CommitFailed):
        await consumer.commit({TopicPartition(topic + "-other", 0): 1})


# --- broker failures -----------------------------------------------------------------------


async def test_producer_recovers_after_a_broker_restart(
    fresh_kafka: TansuBroker,
) -> None:
    topic = unique("restart")
    async with KafkaTransport([fresh_kafka.bootstrap], request_timeout_ms=2000) as transport:
        producer = transport.producer()
        await producer.start()
        assert (await (await producer.send(topic, b"before"))).offset == 0
        fresh_kafka.restart()
        errors: list[Exception] = []

        async def send_once() -> None:
            try:
                async with asyncio.timeout(3):
                    await (await producer.send(topic, b"after"))
                sent.append(True)
            except (TransportError, TimeoutError) as exc:
                errors.append(exc)
                await asyncio.sleep(0.2)

        sent: list[bool] = []
        await until(lambda: bool(sent), send_once, 20)
        assert all(isinstance(e, TransportError | TimeoutError) for e in errors)
