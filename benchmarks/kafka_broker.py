"""The Kafka broker a benchmark runs against: the one ``--bootstrap`` names, or a Tansu
broker started for the run and stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def kafka_broker(bootstrap: str | None) -> Iterator[tuple[str, int | None]]:
    """``(host:port, the broker's pid)``; the pid is None for a broker not started here
    (its CPU cannot be measured)."""
    if bootstrap is not None:
        yield bootstrap, None
        return
    from tests.kafka_broker import TansuBroker

    broker = TansuBroker()
    broker.start()
    try:
        yield broker.bootstrap, broker.proc.pid if broker.proc is not None else None
    finally:
        broker.stop()
