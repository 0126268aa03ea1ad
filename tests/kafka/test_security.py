"""SASL and TLS handshakes with Apache Kafka, on both clients, with the settings that
docs/kafka.md ("Security") shows.

The session's broker has a SASL_PLAINTEXT listener (SCRAM-SHA-512, a user made when its log
directory was formatted), an SSL listener (a certificate signed by a CA made for the
session) and a SASL_SSL one (both): tests/apache_kafka.py. A worker produces and consumes
through each; a wrong password and an untrusted certificate each stop ``flowkit worker``
with one ``Error:`` line that says what failed, at the first refusal rather than after
``connect_timeout``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import pytest

import flowkit
from flowkit.testing import TestDriver
from flowkit.transports import transport_from_url
from tests.apache_kafka import SCRAM_USER, ApacheKafka
from tests.conftest import KAFKA_TEST_SETTINGS
from tests.kafka.conftest import Spawn, start_worker

pytestmark = [pytest.mark.kafka, pytest.mark.apache_kafka]

CLIENTS = ["aiokafka", "rdkafka"]


def listener(broker: ApacheKafka, kind: str) -> tuple[str, dict[str, Any]]:
    """(bootstrap, settings) of the broker's SASL, SSL or SASL_SSL listener."""
    if kind == "sasl":
        return broker.sasl_bootstrap, broker.sasl_settings()
    if kind == "ssl":
        return broker.ssl_bootstrap, broker.ssl_settings()
    return broker.sasl_ssl_bootstrap, broker.sasl_ssl_settings()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", ["sasl", "ssl", "sasl_ssl"])
async def test_a_worker_reads_and_writes_over_a_secured_listener(
    apache_kafka: ApacheKafka, kind: str, client: str
) -> None:
    name = f"secure-{uuid.uuid4().hex[:8]}"  # the session's broker is shared: unique names
    app = flowkit.App(name)
    words = app.topic(f"{name}-words", value_type=str, partitions=2)
    shouted = app.topic(f"{name}-shouted", value_type=str, partitions=2)

    @app.agent(words, sink=[shouted])
    async def shout(stream: flowkit.Stream[str]) -> AsyncIterator[str]:
        async for word in stream:
            yield word.upper()

    bootstrap, settings = listener(apache_kafka, kind)
    transport = transport_from_url(
        f"kafka://{bootstrap}", client=client, **KAFKA_TEST_SETTINGS, **settings
    )
    try:
        async with TestDriver(app, transport=transport, settle=0.3) as driver:
            for word in ("alpha", "beta", "gamma"):
                await driver.send(words, word, key=word)
            await driver.run_until_idle(timeout=30)
            assert sorted(await driver.values(shouted)) == ["ALPHA", "BETA", "GAMMA"]
    finally:
        await transport.aclose()


def url(bootstrap: str, client: str, settings: dict[str, Any]) -> str:
    # connect_timeout is long: the worker must give up at the refusal, not at the timeout.
    query = {**settings, "client": client, "connect_timeout": 120}
    return f"kafka://{bootstrap}?{urlencode(query)}"


async def refused(workers: Spawn, bootstrap: str, client: str, settings: dict[str, Any]) -> str:
    """Start a worker that the broker refuses: its one ``Error:`` line, once it exited 2."""
    worker = start_worker(
        workers,
        f"refused-{client}",
        "tests.kafka.apps.counts_app:app",
        url(bootstrap, client, settings),
    )
    assert await worker.wait(deadline=60) == 2, worker.err
    lines = worker.err.splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert errors == [lines[-1]], worker.err
    assert "Traceback" not in worker.err
    # Nothing else about the refusal: no client's per-attempt log lines.
    assert not [line for line in lines[:-1] if "ERROR" in line or "FAIL" in line], worker.err
    return errors[0]


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_wrong_password_is_one_error_line(
    apache_kafka: ApacheKafka, workers: Spawn, client: str
) -> None:
    settings = apache_kafka.sasl_settings(password="not-the-password")
    line = await refused(workers, apache_kafka.sasl_bootstrap, client, settings)
    assert line == (
        f"Error: Kafka authentication failed at {apache_kafka.sasl_bootstrap} (SCRAM-SHA-512,"
        f" user {SCRAM_USER!r}): Authentication failed during authentication due to invalid"
        " credentials with SASL mechanism SCRAM-SHA-512; check sasl_plain_username and"
        " sasl_plain_password"
    )


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_untrusted_certificate_is_one_error_line(
    apache_kafka: ApacheKafka, workers: Spawn, client: str
) -> None:
    assert apache_kafka.ca is not None
    settings = apache_kafka.ssl_settings(cafile=apache_kafka.ca.other_ca_file)
    line = await refused(workers, apache_kafka.ssl_bootstrap, client, settings)
    assert line == (
        f"Error: TLS handshake with the Kafka broker at {apache_kafka.ssl_bootstrap} failed:"
        " certificate verify failed: self-signed certificate in certificate chain;"
        " see the ssl_cafile setting"
    )
