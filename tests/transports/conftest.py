"""Fixtures for the transport tests: a factory of transports that share one broker.

``transport_factory`` is parametrized by broker: ``memory``; ``kafka`` and ``rdkafka``
(aiokafka and confluent-kafka on the session's Tansu, ``kafka_bootstrap``, or on
``$FLOWKIT_TEST_KAFKA``); ``apache-kafka`` and ``apache-rdkafka`` (the same two clients on the
session's Apache Kafka, ``apache_kafka`` in tests/apache_kafka.py; marked ``apache_kafka``).
Each param has one builder in ``_BUILDERS``: a function taking the pytest ``request`` and
returning a zero-argument function that makes a new ``Transport`` on that broker. The
broker fixtures are asked for by the builders (``request.getfixturevalue``), so a run of
one param starts only its broker.

Names of topics and groups come from ``unique()``: a Kafka broker is shared by every test."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable

import pytest

from flowkit.records import Message, TopicPartition
from flowkit.transports import Consumer, MemoryBroker, MemoryTransport, Transport
from tests.apache_kafka import ApacheKafka

TransportFactory = Callable[[], Transport]

DEADLINE = 20.0
"""Seconds any polling loop may run: Kafka rebalances take a few seconds, memory none."""


def _memory_builder(request: pytest.FixtureRequest) -> TransportFactory:
    broker = MemoryBroker()
    # A size limit as a Kafka producer has one, so the conformance suite can test it.
    return lambda: MemoryTransport(broker, max_record_bytes=1 << 20)


_CLIENT_SETTINGS = {
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 500,
    "fetch_max_wait_ms": 20,
}


def _address(request: pytest.FixtureRequest, apache: bool) -> str:
    if apache:
        broker: ApacheKafka = request.getfixturevalue("apache_kafka")
        return broker.bootstrap
    return str(request.getfixturevalue("kafka_bootstrap"))


def _kafka_builder(apache: bool) -> Callable[[pytest.FixtureRequest], TransportFactory]:
    def build(request: pytest.FixtureRequest) -> TransportFactory:
        from flowkit.transports.kafka import KafkaTransport

        address = _address(request, apache)
        return lambda: KafkaTransport([address], **_CLIENT_SETTINGS)

    return build


def _rdkafka_builder(apache: bool) -> Callable[[pytest.FixtureRequest], TransportFactory]:
    def build(request: pytest.FixtureRequest) -> TransportFactory:
        pytest.importorskip("confluent_kafka")
        from flowkit.transports.rdkafka import RdkafkaTransport

        address = _address(request, apache)
        return lambda: RdkafkaTransport([address], **_CLIENT_SETTINGS)

    return build


_BUILDERS: dict[str, Callable[[pytest.FixtureRequest], TransportFactory]] = {
    "memory": _memory_builder,
    "kafka": _kafka_builder(apache=False),
    "rdkafka": _rdkafka_builder(apache=False),
    "apache-kafka": _kafka_builder(apache=True),
    "apache-rdkafka": _rdkafka_builder(apache=True),
}
_APACHE = [pytest.mark.kafka, pytest.mark.apache_kafka]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("rdkafka", marks=pytest.mark.kafka),
        pytest.param("apache-kafka", marks=_APACHE),
        pytest.param("apache-rdkafka", marks=_APACHE),
    ]
)
async def transport_factory(request: pytest.FixtureRequest) -> AsyncIterator[TransportFactory]:
    """Make transports on one broker; every transport made is closed after the test."""
    build = _BUILDERS[request.param](request)
    made: list[Transport] = []

    def factory() -> Transport:
        transport = build()
        made.append(transport)
        return transport

    yield factory
    for transport in reversed(made):
        await transport.aclose()


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Recorder:
    """A ``RebalanceListener`` that logs its calls into ``events`` and, on revoke,
    commits the consumer's positions first (what the worker does)."""

    def __init__(self, name: str, events: list[tuple[str, str, TopicPartition]]) -> None:
        self.name = name
        self.events = events
        self.consumer: Consumer | None = None
        self.owned: set[TopicPartition] = set()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self.consumer is not None and revoked:
            await self.consumer.commit({tp: self.consumer.position(tp) for tp in revoked})
        self.owned -= revoked
        self.events.extend(("revoked", self.name, tp) for tp in sorted(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.owned |= assigned
        self.events.extend(("assigned", self.name, tp) for tp in sorted(assigned))


async def poll(
    consumers: Iterable[Consumer],
    until: Callable[[], bool],
    into: dict[Consumer, list[Message]] | None = None,
    *,
    deadline: float = DEADLINE,
) -> None:
    """Poll every consumer concurrently, collecting into ``into``, until ``until()``.

    Fails the test if the deadline passes first.
    """
    consumers = list(consumers)
    end = time.monotonic() + deadline
    while not until():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {deadline} s")
        batches = await asyncio.gather(
            *(c.getmany(timeout=0.05, max_records=500) for c in consumers)
        )
        if into is not None:
            for consumer, batch in zip(consumers, batches, strict=True):
                for messages in batch.values():
                    into.setdefault(consumer, []).extend(messages)


async def collect(consumer: Consumer, count: int, *, max_records: int = 500) -> list[Message]:
    """Fetch until ``count`` records arrived (within the deadline); return them in order."""
    got: list[Message] = []
    end = time.monotonic() + DEADLINE
    while len(got) < count:
        if time.monotonic() > end:
            pytest.fail(f"got {len(got)} of {count} records within {DEADLINE} s")
        batch = await consumer.getmany(timeout=0.05, max_records=max_records)
        for messages in batch.values():
            got.extend(messages)
    return got
