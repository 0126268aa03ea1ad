"""Fixtures for flowkit's own tests (the Kafka broker fixtures live in kafka_broker.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
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
from tests.kafka_broker import TansuBroker, fresh_kafka, kafka_bootstrap  # noqa: F401

# Client settings for tests on Kafka: quick rebalances and fetches (docs/kafka.md: Tansu
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
# Apache Kafka with both clients (the session's broker, emptied after each test; needs
# Java and Maven, tests/apache_kafka.py). EVERY_BROKER is every param there is.
_APACHE = [pytest.mark.kafka, pytest.mark.apache_kafka]
APACHE_KAFKA = [
    pytest.param("apache-kafka", marks=_APACHE),
    pytest.param("apache-rdkafka", marks=_APACHE),
]
EVERY_BROKER = [*ALL_CLIENTS, *APACHE_KAFKA]


@pytest.fixture(params=BROKERS)
async def make_driver(request: pytest.FixtureRequest) -> AsyncIterator[DriverFactory]:
    """``make_driver(app, **options)`` -> a TestDriver on this test's broker.

    The param names the broker and the client: ``memory``; ``kafka`` and ``rdkafka``
    (aiokafka and confluent-kafka on a Tansu of the test's own); ``apache-kafka`` and
    ``apache-rdkafka`` (the same clients on the session's Apache Kafka, which is emptied of
    topics and groups after the test). By default a test runs on ``memory`` and ``kafka``;
    ``@pytest.mark.parametrize("make_driver", EVERY_BROKER, indirect=True)`` (or
    ``ALL_CLIENTS``, ``APACHE_KAFKA``) chooses others.

    Every driver made in one test shares the broker, so a second one is a restart. Either
    way a test has its broker to itself, so fixed topic and app names never collide.
    """
    transports: list[Transport] = []
    if request.param == "memory":
        broker = MemoryBroker()

        def make(app: flowkit.App, **options: Any) -> TestDriver:
            return TestDriver(app, broker=broker, **options)

        yield make
        return

    from flowkit.transports import transport_from_url

    server: TansuBroker | ApacheKafka = request.getfixturevalue(
        "clean_apache_kafka" if request.param.startswith("apache-") else "fresh_kafka"
    )
    client = "rdkafka" if request.param.endswith("rdkafka") else "aiokafka"

    def make_kafka(app: flowkit.App, **options: Any) -> TestDriver:
        transport = transport_from_url(server.url, client=client, **KAFKA_TEST_SETTINGS)
        transports.append(transport)
        options.setdefault("settle", 0.3)
        return TestDriver(app, transport=transport, **options)

    yield make_kafka
    for transport in transports:
        await transport.aclose()


class WindowStores:
    """Which store the tumbling and hopping tables of a test keep their state in (the
    ``window_store`` fixture): ``memory`` or ``rocksdb``. With ``rocksdb`` every App the
    test declares without a store takes ``rocksdb://`` and a data directory of the test's
    own; ``fresh()`` gives the Apps declared after it another one (a Hypothesis example's
    own state)."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.n = 0

    @property
    def data_dir(self) -> Path:
        return self.root / f"data{self.n}"

    def fresh(self) -> None:
        self.n += 1


WINDOW_STORES = ["memory", "rocksdb"]


@pytest.fixture(params=WINDOW_STORES)
def window_store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> WindowStores:
    """Runs the test once per store of windowed tables: the window suites' conformance
    across stores (``pytestmark = pytest.mark.usefixtures("window_store")``)."""
    stores = WindowStores(str(request.param), tmp_path)
    if stores.kind == "rocksdb":
        declare = flowkit.App.__init__

        def on_disk(self: flowkit.App, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("store", "rocksdb://")
            kwargs.setdefault("data_dir", stores.data_dir)
            declare(self, *args, **kwargs)

        monkeypatch.setattr(flowkit.App, "__init__", on_disk)
    return stores
