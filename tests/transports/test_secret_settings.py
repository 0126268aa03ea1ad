"""Secret settings, without a broker: redaction of URLs and settings (a property test
tries to slip a secret past it), the refusal of credentials before the host, the checks of
the OAUTHBEARER and key-password settings, what a token provider may return, and the
client-credentials grant's one-line errors."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowkit.errors import ConfigurationError
from flowkit.redaction import MASK, redact_settings, redact_url
from flowkit.transports import parse_broker_url, transport_from_url
from flowkit.transports._kafka_common import check_security
from flowkit.transports._oauth import ClientCredentials, token_and_expiry
from flowkit.transports.kafka.settings import check_settings as kafka_settings
from flowkit.transports.rdkafka.settings import check_settings as rdkafka_settings
from flowkit.transports.rdkafka.settings import client_config

SECRET_NAMES = ["sasl_plain_password", "ssl_key_password", "sasl_oauth_client_secret"]
# A secret: a marker no URL part has, then anything a password may hold.
secrets = st.text(min_size=1, max_size=20).map(lambda tail: "Zq9Secret" + tail)


@given(secret=secrets, name=st.sampled_from(SECRET_NAMES), port=st.sampled_from(["9092", "x"]))
def test_a_redacted_url_holds_no_secret(secret: str, name: str, port: str) -> None:
    encoded = quote(secret, safe="")
    for url in (
        f"kafka://shop:{encoded}@k1:{port}?{name}={encoded}&linger_ms=5",
        f"kafka://k1:{port},k2:9092?client=rdkafka&{name}={encoded}#frag",
        f"kafka://{encoded}@k1:{port}",
    ):
        shown = redact_url(url)
        assert secret not in shown and encoded not in shown, shown
        try:
            parse_broker_url(url)
        except ConfigurationError as exc:
            assert secret not in str(exc) and encoded not in str(exc), str(exc)


def test_redaction_keeps_what_is_not_secret() -> None:
    assert redact_url("kafka://k1:9092?linger_ms=5&sasl_plain_username=shop") == (
        "kafka://k1:9092?linger_ms=5&sasl_plain_username=shop"
    )
    settings = {"sasl_plain_username": "shop", "sasl_oauth_token_provider": print}
    assert redact_settings(settings) == {
        "sasl_plain_username": "shop",
        "sasl_oauth_token_provider": MASK,
    }


def test_credentials_before_the_host_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigurationError) as refusal:
        transport_from_url("kafka://shop:hunter2@k1:9092")
    assert str(refusal.value) == (
        "broker URL 'kafka://***@k1:9092': credentials do not go before the host; give them"
        " as the sasl_plain_username and sasl_plain_password settings (see the Security"
        " section of the Kafka docs)"
    )


@pytest.mark.parametrize("check", [kafka_settings, rdkafka_settings])
def test_a_bad_value_of_a_secret_setting_is_not_shown(check: Any) -> None:
    with pytest.raises(ConfigurationError) as refusal:
        check(
            {
                "security_protocol": "SASL_SSL",
                "sasl_plain_username": "u",
                "sasl_plain_password": 12345,
            }
        )
    assert "12345" not in str(refusal.value)
    assert "sasl_plain_password=***: expected a non-empty string" in str(refusal.value)


OIDC = {
    "sasl_oauth_token_endpoint_url": "https://idp.example/token",
    "sasl_oauth_client_id": "shop",
    "sasl_oauth_client_secret": "s",
}
OAUTH = {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({**OAUTH, **OIDC, "sasl_oauth_token_provider": print}, "not both"),
        ({**OAUTH, "sasl_oauth_client_id": "shop"}, "needs sasl_oauth_token_provider, or"),
        ({"security_protocol": "SASL_SSL", **OIDC}, "need sasl_mechanism=OAUTHBEARER"),
        ({"security_protocol": "SSL", "ssl_key_password": "k"}, "needs ssl_certfile"),
    ],
)
def test_security_settings_that_do_not_fit_together_are_refused(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        check_security(settings)


def test_oauthbearer_settings_reach_librdkafka() -> None:
    config = client_config(rdkafka_settings({**OAUTH, **OIDC}), "producer")
    assert config["sasl.oauthbearer.method"] == "oidc"
    assert config["sasl.oauthbearer.client.secret"] == "s"
    config = client_config(
        rdkafka_settings({**OAUTH, "sasl_oauth_token_provider": lambda: ("t", 9e9)}), "admin"
    )
    assert config["oauth_cb"]("") == ("t", 9e9)


@pytest.mark.parametrize("answer", [None, "", ("t",), (b"t", 1.0), ("t", "soon"), 42])
def test_a_token_provider_that_returns_something_else_is_refused(answer: object) -> None:
    with pytest.raises(ConfigurationError, match="sasl_oauth_token_provider returned"):
        token_and_expiry(answer, now=0.0)


def test_an_unreachable_token_endpoint_is_one_line_without_the_secret() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    grant = ClientCredentials(f"http://127.0.0.1:{port}/token?key=k1", "shop", "hunter2", timeout=5)
    with pytest.raises(ConfigurationError) as refusal:
        grant()
    message = str(refusal.value)
    endpoint = f"http://127.0.0.1:{port}/token?key=k1"
    assert message.startswith(
        f"no OAUTHBEARER token from {endpoint} for client 'shop': cannot reach"
    )
    assert "hunter2" not in message and "\n" not in message
    assert "hunter2" not in repr(grant)


async def test_a_token_that_cannot_be_renewed_is_a_lost_connection_for_aiokafka() -> None:
    import aiokafka.errors as kerr

    from flowkit.transports.kafka.security import KafkaTokenProvider

    answers: list[object] = [None, ("t", 9e9), None]
    provider = KafkaTokenProvider(lambda: answers.pop(0))
    with pytest.raises(ConfigurationError):  # at the start: one line, the worker stops
        await provider.token()
    assert await provider.token() == "t"
    with pytest.raises(kerr.KafkaConnectionError, match="sasl_oauth_token_provider returned"):
        await provider.token()  # later: retried by aiokafka as a lost connection
