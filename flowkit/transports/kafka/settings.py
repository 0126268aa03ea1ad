"""Kafka client settings: which client takes each one, flowkit's defaults, and the checks
that refuse an unknown name or a bad value with ``ConfigurationError`` up front (rather
than as an aiokafka error at connect time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiokafka
import structlog

from ...errors import ConfigurationError
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

__all__ = ["DEAD_LETTER_ROOM", "DEFAULTS", "KINDS", "check_settings"]

log = structlog.get_logger(__name__)

# Which client takes each setting: "client" ones go to every aiokafka client, "producer",
# "consumer" and "group" ones to those; "flowkit" ones KafkaTransport uses itself.
KINDS: dict[str, dict[str, Check]] = {
    "flowkit": {
        "broker_timeout": SECONDS,
        "client_id": STR,
        "connect_timeout": SECONDS,
        "ssl_cafile": STR,
        "ssl_certfile": STR,
        "ssl_keyfile": STR,
        "ssl_key_password": STR,
        # OAUTHBEARER: a token provider, or the OIDC client-credentials settings
        # (aiokafka takes the token provider that flowkit.transports.kafka.security makes).
        "sasl_oauth_token_provider": CALLABLE,
        "sasl_oauth_token_endpoint_url": HTTP_URL,
        "sasl_oauth_client_id": STR,
        "sasl_oauth_client_secret": STR,
        "sasl_oauth_scope": STR,
    },
    "client": {
        "request_timeout_ms": POS,
        "retry_backoff_ms": NONNEG,
        "metadata_max_age_ms": NONNEG,
        "security_protocol": SECURITY_PROTOCOL,
        "sasl_mechanism": SASL_MECHANISM,
        "sasl_plain_username": STR,
        "sasl_plain_password": STR,
    },
    "producer": {
        "acks": ACKS,
        "compression_type": COMPRESSION,
        "linger_ms": NONNEG,
        "max_batch_size": POS,
        "max_request_size": POS,
        "transaction_timeout_ms": POS,  # exactly-once only
    },
    "consumer": {
        "fetch_max_wait_ms": NONNEG,
        "fetch_min_bytes": POS,
        "fetch_max_bytes": POS,
        "max_partition_fetch_bytes": POS,
        "session_timeout_ms": POS,
        "heartbeat_interval_ms": POS,
        "max_poll_interval_ms": POS,
        "rebalance_timeout_ms": POS,
        "isolation_level": ISOLATION,
    },
    "group": {"group_instance_id": STR},  # static membership (KIP-345), group members only
}
_CHECKS = {name: check for kind in KINDS.values() for name, check in kind.items()}
# flowkit's defaults where they differ from aiokafka's (the package docstring says why).
DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10.0,
    # How long a running worker waits for a lost broker before it stops (BrokerWatch);
    # sends in flight must outlive it, so requests time out only after it.
    "broker_timeout": 60.0,
    "request_timeout_ms": 70_000,
    "acks": "all",
    "linger_ms": 5,
    "max_batch_size": 256 * 1024,
    "fetch_max_wait_ms": 50,
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
}


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` over ``DEFAULTS``, once every name, value and combination is valid.

    >>> check_settings({"linger_ms": 2})["linger_ms"]
    2
    >>> check_settings({"linger": 2})
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: unknown Kafka setting 'linger' (known: ...)
    """
    check_values(settings, _CHECKS, "Kafka")
    s = {**DEFAULTS, **settings}
    if "request_timeout_ms" not in settings:  # outlive broker_timeout, whatever it is
        s["request_timeout_ms"] = max(40_000, int(s["broker_timeout"] * 1000) + 10_000)
    check_heartbeat(s, "Kafka", session_default_ms=10_000)
    codec = s.get("compression_type")
    if codec is not None and not getattr(aiokafka.codec, f"has_{codec}")():
        raise ConfigurationError(f"Kafka setting compression_type={codec!r}: codec not installed")
    check_security(s)
    room = s["max_partition_fetch_bytes"] + DEAD_LETTER_ROOM
    if "max_request_size" not in s:
        s["max_request_size"] = room
    elif s["max_request_size"] < room:
        log.warning(
            "Kafka setting max_request_size is below max_partition_fetch_bytes + 64 KiB: "
            "a record the worker reads may be too large to dead-letter whole (it is then "
            "truncated)",
            max_request_size=s["max_request_size"],
            max_partition_fetch_bytes=s["max_partition_fetch_bytes"],
        )
    return s
