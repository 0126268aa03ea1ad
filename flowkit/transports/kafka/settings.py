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
from .._kafka_common import DEAD_LETTER_ROOM, NONNEG, POS, SECONDS, STR, Check, one_of

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
    },
    "client": {
        "request_timeout_ms": POS,
        "retry_backoff_ms": NONNEG,
        "metadata_max_age_ms": NONNEG,
        "security_protocol": one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
        "sasl_mechanism": one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        "sasl_plain_username": STR,
        "sasl_plain_password": STR,
    },
    "producer": {
        "acks": one_of(0, 1, -1, "all"),
        "compression_type": one_of(None, "gzip", "snappy", "lz4", "zstd"),
        "linger_ms": NONNEG,
        "max_batch_size": POS,
        "max_request_size": POS,
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
        "isolation_level": one_of("read_uncommitted", "read_committed"),
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
    for name, value in settings.items():
        if name not in _CHECKS:
            known = ", ".join(sorted(_CHECKS))
            raise ConfigurationError(f"unknown Kafka setting {name!r} (known: {known})")
        ok, expected = _CHECKS[name]
        if not ok(value):
            raise ConfigurationError(f"Kafka setting {name}={value!r}: expected {expected}")
    s = {**DEFAULTS, **settings}
    if "request_timeout_ms" not in settings:  # outlive broker_timeout, whatever it is
        s["request_timeout_ms"] = max(40_000, int(s["broker_timeout"] * 1000) + 10_000)
    if s.get("heartbeat_interval_ms", 3000) >= s.get("session_timeout_ms", 10000):
        raise ConfigurationError("Kafka setting heartbeat_interval_ms must be < session_timeout_ms")
    codec = s.get("compression_type")
    if codec is not None and not getattr(aiokafka.codec, f"has_{codec}")():
        raise ConfigurationError(f"Kafka setting compression_type={codec!r}: codec not installed")
    protocol = s.get("security_protocol", "PLAINTEXT")
    if "SSL" not in protocol and any(name.startswith("ssl_") for name in s):
        raise ConfigurationError(f"ssl_* Kafka settings need security_protocol SSL, not {protocol}")
    if protocol.startswith("SASL") and not (
        "sasl_plain_username" in s and "sasl_plain_password" in s
    ):
        raise ConfigurationError(f"security_protocol={protocol} needs sasl_plain_username/password")
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
