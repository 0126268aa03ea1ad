"""Fixtures for flowkit's own tests (the Kafka broker fixtures live in kafka_broker.py)."""

from __future__ import annotations

import pytest

from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker
from tests.kafka_broker import fresh_kafka, kafka_bootstrap  # noqa: F401


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
