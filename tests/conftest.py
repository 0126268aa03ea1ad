"""Fixtures for flowkit's own tests (the Kafka broker fixtures live in kafka_broker.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, Transport
from tests.apache_kafka import (  # noqa: F401
    ApacheKafka,
    apache_kafka,
    clean_apache_kafka,
    fresh_apache_kafka,
)
from tests.kafka_broker import (  # noqa: F401
    TansuBroker,
    durable_kafka,
    fresh_kafka,
    kafka_bootstrap,
    moto_s3,
)

# Client settings for tests on Tansu: quick rebalances and fetches (docs/kafka.md: the broker
# holds each group join for half the session timeout).
KAFKA_TEST_SETTINGS: dict[str, Any] = {
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 400,
    "fetch_max_wait_ms": 20,
    "linger_ms": 1,
}


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


DriverFactory = Callable[..., TestDriver]


BROKERS = ["memory", pytest.param("kafka", marks=pytest.mark.kafka)]
# The librdkafka client too: for a representative subset of the Kafka tests (the YSB
# query, an agent, a table), with ``@pytest.mark.parametrize("make_driver", ALL_CLIENTS,
# indirect=True)``; running every Kafka test on both clients would double their time.
ALL_CLIENTS = [*BROKERS, pytest.param("rdkafka", marks=pytest.mark.kafka)]


@pytest.fixture(params=BROKERS)
async def make_driver(request: pytest.FixtureRequest) -> AsyncIterator[DriverFactory]:
    """``make_driver(app, **options)`` -> a TestDriver on this test's broker.

    Every driver made in one test shares the broker, so a second one is a restart. On
    Kafka each test gets its own Tansu process, so fixed topic names never collide.
    The param is ``memory``, ``kafka`` (aiokafka) or ``rdkafka`` (confluent-kafka).
    """
    transports: list[Transport] = []
    if request.param == "memory":
        broker = MemoryBroker()

        def make(app: flowkit.App, **options: Any) -> TestDriver:
            return TestDriver(app, broker=broker, **options)

        yield make
        return

    from flowkit.transports import transport_from_url

    tansu: TansuBroker = request.getfixturevalue("fresh_kafka")
    client = "rdkafka" if request.param == "rdkafka" else "aiokafka"

    def make_kafka(app: flowkit.App, **options: Any) -> TestDriver:
        transport = transport_from_url(tansu.url, client=client, **KAFKA_TEST_SETTINGS)
        transports.append(transport)
        options.setdefault("settle", 0.3)
        return TestDriver(app, transport=transport, **options)

    yield make_kafka
    for transport in transports:
        await transport.aclose()
