"""SASL and TLS handshakes with Apache Kafka, on both clients, with the settings that
docs/kafka.md ("Security") shows.

The session's broker has a SASL_PLAINTEXT listener (SCRAM-SHA-512, a user made when its log
directory was formatted), an SSL listener (a certificate signed by a CA made for the
session), a SASL_SSL one (both), an SSL listener that requires a client certificate, and a
SASL_PLAINTEXT one with OAUTHBEARER (unsecured JWTs): tests/apache_kafka.py. A worker
produces and consumes through each, with tokens from a provider function or from an OIDC
token endpoint served here (``TokenEndpoint``), and with a client key encrypted with a
password. A wrong password, a refused or expired token, a wrong key password and an
untrusted certificate each stop ``flowkit worker`` with one ``Error:`` line that says what
failed, at the first refusal rather than after ``connect_timeout``.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest

import flowkit
from flowkit.errors import ConfigurationError
from flowkit.testing import TestDriver
from flowkit.transports import transport_from_url
from tests.apache_kafka import SCRAM_USER, ApacheKafka, unsecured_jwt
from tests.conftest import KAFKA_TEST_SETTINGS
from tests.kafka.conftest import Spawn, start_worker
from tests.tracebacks import crashes

pytestmark = [pytest.mark.kafka, pytest.mark.apache_kafka]

CLIENTS = ["aiokafka", "rdkafka"]


CLIENT_ID, CLIENT_SECRET = "shop", "oidc-client-secret"


class TokenEndpoint:
    """An OIDC token endpoint on 127.0.0.1 (``url``) for the client-credentials grant: it
    gives the client ``CLIENT_ID``/``CLIENT_SECRET`` (HTTP Basic) an unsecured JWT valid
    for ``lifetime`` seconds (negative: already expired), refuses any other with 401
    ``invalid_client``, and keeps each request's form in ``requests``."""

    def __init__(self, lifetime: float = 3600.0) -> None:
        self.lifetime = lifetime
        self.requests: list[dict[str, str]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                form = {k: v[-1] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                endpoint.requests.append(form)
                basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
                if self.headers.get("Authorization") != f"Basic {basic}":
                    return self._answer(401, {"error": "invalid_client"})
                if form.get("grant_type") != "client_credentials":
                    return self._answer(400, {"error": "unsupported_grant_type"})
                token = unsecured_jwt(CLIENT_ID, endpoint.lifetime, scope=form.get("scope", ""))
                self._answer(
                    200, {"access_token": token, "token_type": "Bearer", "expires_in": 3600}
                )

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def token_endpoint() -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.close()


def oidc(endpoint: TokenEndpoint, secret: str = CLIENT_SECRET) -> dict[str, Any]:
    """The sasl_oauth_* settings (without the prefix) for ``endpoint``."""
    return {
        "token_endpoint_url": endpoint.url,
        "client_id": CLIENT_ID,
        "client_secret": secret,
        "scope": "kafka",
    }


def listener(broker: ApacheKafka, kind: str) -> tuple[str, dict[str, Any]]:
    """(bootstrap, settings) of one of the broker's secured listeners."""
    if kind == "sasl":
        return broker.sasl_bootstrap, broker.sasl_settings()
    if kind == "ssl":
        return broker.ssl_bootstrap, broker.ssl_settings()
    if kind == "mtls":  # a client certificate whose key is encrypted
        return broker.mtls_bootstrap, broker.mtls_settings()
    if kind == "oauth_provider":
        return broker.oauth_bootstrap, broker.oauth_settings(token_provider=unsecured_jwt)
    return broker.sasl_ssl_bootstrap, broker.sasl_ssl_settings()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", ["sasl", "ssl", "sasl_ssl", "mtls", "oauth_provider"])
async def test_a_worker_reads_and_writes_over_a_secured_listener(
    apache_kafka: ApacheKafka, kind: str, client: str
) -> None:
    bootstrap, settings = listener(apache_kafka, kind)
    await round_trip(bootstrap, client, settings)


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_worker_authenticates_with_tokens_from_an_oidc_endpoint(
    apache_kafka: ApacheKafka, token_endpoint: TokenEndpoint, client: str
) -> None:
    settings = apache_kafka.oauth_settings(**oidc(token_endpoint))
    await round_trip(apache_kafka.oauth_bootstrap, client, settings)
    assert token_endpoint.requests, "the token endpoint was never asked"
    assert all(
        r == {"grant_type": "client_credentials", "scope": "kafka"} for r in token_endpoint.requests
    ), token_endpoint.requests


async def round_trip(bootstrap: str, client: str, settings: dict[str, Any]) -> None:
    """A worker reads three words through the listener and writes them back shouted."""
    name = f"secure-{uuid.uuid4().hex[:8]}"  # the session's broker is shared: unique names
    app = flowkit.App(name)
    words = app.topic(f"{name}-words", value_type=str, partitions=2)
    shouted = app.topic(f"{name}-shouted", value_type=str, partitions=2)

    @app.agent(words, sink=[shouted])
    async def shout(stream: flowkit.Stream[str]) -> AsyncIterator[str]:
        async for word in stream:
            yield word.upper()

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
    assert not crashes(worker.err)
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


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_wrong_key_password_is_one_error_line(
    apache_kafka: ApacheKafka, workers: Spawn, client: str
) -> None:
    assert apache_kafka.ca is not None
    settings = apache_kafka.mtls_settings(key_password="not-the-key-password")
    line = await refused(workers, apache_kafka.mtls_bootstrap, client, settings)
    key = apache_kafka.ca.client_key
    assert line == (
        f"Error: Kafka ssl_* settings: cannot load the client key from {key}:"
        " a wrong or missing ssl_key_password, or not a PEM key"
    )


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_client_the_token_endpoint_refuses_is_one_error_line(
    apache_kafka: ApacheKafka, workers: Spawn, token_endpoint: TokenEndpoint, client: str
) -> None:
    settings = apache_kafka.oauth_settings(**oidc(token_endpoint, secret="not-the-secret"))
    line = await refused(workers, apache_kafka.oauth_bootstrap, client, settings)
    if client == "aiokafka":  # flowkit's own client-credentials grant
        assert line == (
            f"Error: no OAUTHBEARER token from {token_endpoint.url} for client {CLIENT_ID!r}:"
            " HTTP 401 invalid_client; check the sasl_oauth_* settings"
        )
    else:  # librdkafka's
        assert line == (
            f"Error: Kafka authentication failed at {apache_kafka.oauth_bootstrap}"
            ' (OAUTHBEARER): Failed to acquire SASL OAUTHBEARER token: {"error":'
            ' "invalid_client"}; check the token the sasl_oauth_* settings give'
        )


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_expired_token_is_one_error_line(
    apache_kafka: ApacheKafka, workers: Spawn, client: str
) -> None:
    endpoint = TokenEndpoint(lifetime=-60)
    try:
        settings = apache_kafka.oauth_settings(**oidc(endpoint))
        line = await refused(workers, apache_kafka.oauth_bootstrap, client, settings)
    finally:
        endpoint.close()
    prefix = f"Error: Kafka authentication failed at {apache_kafka.oauth_bootstrap} (OAUTHBEARER): "
    assert line.startswith(prefix), line
    assert line.endswith("; check the token the sasl_oauth_* settings give"), line
    if client == "rdkafka":  # librdkafka refuses it before sending it
        assert "Must supply an unexpired token" in line, line


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_token_the_broker_refuses_is_a_configuration_error(
    apache_kafka: ApacheKafka, client: str
) -> None:
    app = flowkit.App(f"refused-token-{uuid.uuid4().hex[:8]}")
    app.topic(f"{app.name}-words", value_type=str)
    not_a_jwt = "opaque-token-the-broker-cannot-read"
    settings = apache_kafka.oauth_settings(token_provider=lambda: not_a_jwt)
    transport = transport_from_url(
        f"kafka://{apache_kafka.oauth_bootstrap}", client=client, connect_timeout=60, **settings
    )
    try:
        with pytest.raises(ConfigurationError) as refusal:
            async with TestDriver(app, transport=transport):
                pass
    finally:
        await transport.aclose()
    message = str(refusal.value)
    assert message.startswith(
        f"Kafka authentication failed at {apache_kafka.oauth_bootstrap} (OAUTHBEARER): "
    ), message
    assert not_a_jwt not in message


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_mechanism_the_listener_does_not_enable_is_one_error_line(
    apache_kafka: ApacheKafka, workers: Spawn, client: str
) -> None:
    settings = {**apache_kafka.sasl_settings(), "sasl_mechanism": "SCRAM-SHA-256"}
    line = await refused(workers, apache_kafka.sasl_bootstrap, client, settings)
    assert line.startswith(
        f"Error: Kafka authentication failed at {apache_kafka.sasl_bootstrap} (SCRAM-SHA-256,"
        f" user {SCRAM_USER!r}): "
    ), line
    if client == "rdkafka":  # librdkafka names what the listener has; aiokafka does not
        assert "SCRAM-SHA-512" in line, line
    assert line.endswith("; check sasl_mechanism"), line


async def test_an_apps_own_token_provider_serves_its_workers(apache_kafka: ApacheKafka) -> None:
    # What `flowkit worker` does with the app: a Worker from the app and a URL alone.
    tokens: list[str] = []

    def provider() -> str:
        tokens.append(unsecured_jwt())
        return tokens[-1]

    name = f"app-token-{uuid.uuid4().hex[:8]}"
    app = flowkit.App(name, client_settings=apache_kafka.oauth_settings(token_provider=provider))
    app.topic(f"{name}-words", value_type=str)
    worker = flowkit.Worker(app, broker=f"kafka://{apache_kafka.oauth_bootstrap}")
    async with worker:
        pass
    assert tokens, "the app's token provider was never asked"
    # The same app, on the memory broker: its Kafka settings are not used there.
    async with flowkit.Worker(app, broker="memory://") as worker:
        pass
