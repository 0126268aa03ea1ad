"""librdkafka client settings: flowkit's names (the same as the aiokafka transport's, so a
URL works on both clients), the librdkafka property each one sets, flowkit's defaults, and
the checks that refuse an unknown name or a bad value with one ``ConfigurationError`` line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .._kafka_common import (
    ACKS,
    CALLABLE,
    COMPRESSION,
    DEAD_LETTER_ROOM,
    HTTP_URL,
    ISOLATION,
    NONNEG,
    POS,
    SASL_MECHANISM,
    SECONDS,
    SECURITY_PROTOCOL,
    STR,
    Check,
    check_heartbeat,
    check_security,
    check_values,
)
from .._oauth import TokenProvider, token_and_expiry

__all__ = ["DEFAULTS", "SETTINGS", "check_settings", "client_config"]

# name -> (check, librdkafka property or None for flowkit's own, which clients take it).
# Roles: "all" clients, "producer", "consumer", "group" (consumers with a group_id).
SETTINGS: dict[str, tuple[Check, str | None, str]] = {
    "client_id": (STR, None, "all"),
    "connect_timeout": (SECONDS, None, "all"),
    "broker_timeout": (SECONDS, None, "all"),
    "request_timeout_ms": (POS, "socket.timeout.ms", "all"),
    "retry_backoff_ms": (NONNEG, "retry.backoff.ms", "all"),
    "metadata_max_age_ms": (POS, "metadata.max.age.ms", "all"),
    "security_protocol": (SECURITY_PROTOCOL, "security.protocol", "all"),
    "sasl_mechanism": (SASL_MECHANISM, "sasl.mechanism", "all"),
    "sasl_plain_username": (STR, "sasl.username", "all"),
    "sasl_plain_password": (STR, "sasl.password", "all"),
    "ssl_cafile": (STR, "ssl.ca.location", "all"),
    "ssl_certfile": (STR, "ssl.certificate.location", "all"),
    "ssl_keyfile": (STR, "ssl.key.location", "all"),
    "ssl_key_password": (STR, "ssl.key.password", "all"),
    # OAUTHBEARER: a token provider (librdkafka's oauth_cb), or librdkafka's own OIDC
    # client-credentials grant (sasl.oauthbearer.method=oidc, set by client_config).
    "sasl_oauth_token_provider": (CALLABLE, None, "all"),
    "sasl_oauth_token_endpoint_url": (HTTP_URL, "sasl.oauthbearer.token.endpoint.url", "all"),
    "sasl_oauth_client_id": (STR, "sasl.oauthbearer.client.id", "all"),
    "sasl_oauth_client_secret": (STR, "sasl.oauthbearer.client.secret", "all"),
    "sasl_oauth_scope": (STR, "sasl.oauthbearer.scope", "all"),
    "acks": (ACKS, "acks", "producer"),
    "compression_type": (COMPRESSION, "compression.type", "producer"),
    "linger_ms": (NONNEG, "linger.ms", "producer"),
    "max_batch_size": (POS, "batch.size", "producer"),
    "max_request_size": (POS, "message.max.bytes", "producer"),
    "transaction_timeout_ms": (POS, "transaction.timeout.ms", "producer"),
    "fetch_max_wait_ms": (NONNEG, "fetch.wait.max.ms", "consumer"),
    "fetch_min_bytes": (POS, "fetch.min.bytes", "consumer"),
    "fetch_max_bytes": (POS, "fetch.max.bytes", "consumer"),
    "max_partition_fetch_bytes": (POS, "max.partition.fetch.bytes", "consumer"),
    "fetch_queue_backoff_ms": (NONNEG, "fetch.queue.backoff.ms", "consumer"),
    "queued_max_messages_kbytes": (POS, "queued.max.messages.kbytes", "consumer"),
    "session_timeout_ms": (POS, "session.timeout.ms", "group"),
    "heartbeat_interval_ms": (POS, "heartbeat.interval.ms", "group"),
    "max_poll_interval_ms": (POS, "max.poll.interval.ms", "group"),
    "isolation_level": (ISOLATION, "isolation.level", "consumer"),
    "group_instance_id": (STR, "group.instance.id", "group"),
}

_CHECKS = {name: check for name, (check, _, _) in SETTINGS.items()}

# flowkit's defaults, the aiokafka transport's where both clients have the setting.
# fetch_queue_backoff_ms: librdkafka's default (1000 ms) pauses a partition's fetches for a
# second whenever its local queue is full, which caps consuming at a few thousand records/s
# on some brokers; 10 ms keeps the queue topped up.
DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10.0,
    "broker_timeout": 60.0,  # how long a running worker waits for a lost broker
    "acks": "all",
    "linger_ms": 5,
    "max_batch_size": 256 * 1024,
    "fetch_max_wait_ms": 50,
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
    "fetch_queue_backoff_ms": 10,
}


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` over ``DEFAULTS``, once every name, value and combination is valid.

    >>> check_settings({"linger_ms": 2})["linger_ms"]
    2
    >>> check_settings({"linger": 2})
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: unknown rdkafka setting 'linger' (known: ...)
    """
    check_values(settings, _CHECKS, "rdkafka")
    s = {**DEFAULTS, **settings}
    check_heartbeat(s, "rdkafka", session_default_ms=45_000)
    check_security(s)
    # What the worker can read it can dead-letter (as on the aiokafka transport): the
    # producer takes the largest fetched record plus room for the dead-letter headers.
    if "max_request_size" not in s:
        s["max_request_size"] = s["max_partition_fetch_bytes"] + DEAD_LETTER_ROOM
    return s


def client_config(settings: Mapping[str, Any], role: str) -> dict[str, Any]:
    """The librdkafka properties of checked ``settings`` that a ``role`` client takes
    (``"producer"``, ``"consumer"``, ``"group"`` for a group member, or ``"admin"``).

    >>> client_config(check_settings({"compression_type": None}), "producer")["compression.type"]
    'none'
    """
    roles = {"all", role} | ({"consumer"} if role == "group" else set())
    config: dict[str, Any] = {}
    for name, value in settings.items():
        _, prop, where = SETTINGS[name]
        if prop is not None and where in roles:
            config[prop] = "none" if value is None else value
    if "sasl_oauth_token_endpoint_url" in settings:
        config["sasl.oauthbearer.method"] = "oidc"
    if "sasl_oauth_token_provider" in settings:
        config["oauth_cb"] = _oauth_cb(settings["sasl_oauth_token_provider"])
    return config


def _oauth_cb(provider: TokenProvider) -> Callable[[str], tuple[str, float]]:
    """librdkafka's ``oauth_cb`` over a flowkit token provider: called (in the thread that
    polls the client) with the unused ``sasl.oauthbearer.config``, it returns the token and
    its expiry in Unix seconds."""

    def oauth_cb(_config: str) -> tuple[str, float]:
        return token_and_expiry(provider(), time.time())

    return oauth_cb
