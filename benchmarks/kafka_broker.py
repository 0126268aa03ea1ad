"""The Kafka broker a benchmark runs against: the one ``--bootstrap`` names, or one started
for the run and stopped after it: Tansu (``--broker tansu``, the default: what
``flowkit dev-broker`` runs) or Apache Kafka itself (``--broker apache-kafka``: the test
suite's broker, tests/apache_kafka.py, which needs Java and Maven)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.apache_kafka import ApacheKafka
    from tests.kafka_broker import TansuBroker

BROKERS = ("tansu", "apache-kafka")


def add_broker_options(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` and ``--broker``, for a benchmark that runs on either broker."""
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: start one)")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="tansu",
        help="the broker to start without --bootstrap (default: tansu)",
    )


@contextmanager
def kafka_broker(bootstrap: str | None, broker: str = "tansu") -> Iterator[tuple[str, int | None]]:
    """``(host:port, the broker's pid)``; the pid is None for a broker not started here
    (its CPU cannot be measured)."""
    if bootstrap is not None:
        yield bootstrap, None
        return
    server: ApacheKafka | TansuBroker
    if broker == "apache-kafka":
        from tests.apache_kafka import ApacheKafka

        server = ApacheKafka(Path(tempfile.mkdtemp(prefix="flowkit-bench-kafka-")))
    else:
        from tests.kafka_broker import TansuBroker

        server = TansuBroker()
    server.start()
    try:
        yield server.bootstrap, server.proc.pid if server.proc is not None else None
    finally:
        server.stop()
