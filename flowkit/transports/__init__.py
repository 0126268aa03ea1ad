"""Transports: how flowkit talks to a broker.

``transport_from_url("memory://")`` gives the embedded broker; ``"kafka://host:port"``
gives the aiokafka transport, imported only then, so memory-only users never load aiokafka;
``"kafka://host:port?client=rdkafka"`` gives the librdkafka one (``flowkit[rdkafka]``).
``read_to_end`` and ``read_topic`` read partitions up to the high watermark their fetches
report, for any transport.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigurationError
from ..redaction import redact_url as redact
from .base import (
    Ack,
    Consumer,
    OffsetReset,
    OutRecord,
    Producer,
    RebalanceListener,
    TopicSpec,
    TransactionalProducer,
    Transport,
)
from .memory import MemoryBroker, MemoryTransport
from .reading import read_to_end, read_topic

__all__ = [
    "Ack",
    "Consumer",
    "MemoryBroker",
    "MemoryTransport",
    "OffsetReset",
    "OutRecord",
    "Producer",
    "RebalanceListener",
    "TopicSpec",
    "TransactionalProducer",
    "Transport",
    "parse_broker_url",
    "read_to_end",
    "read_topic",
    "redact",
    "transport_from_url",
    "url_settings",
]

SCHEMES = ("memory", "kafka")
CLIENTS = ("aiokafka", "rdkafka")
_TEXT_SETTINGS = {"client", "client_id", "group_instance_id", "security_protocol"}


def parse_broker_url(url: str) -> tuple[str, list[str]]:
    """Split a broker URL into its scheme and a list of ``host:port`` servers.

    Errors show the URL through ``redact`` (no secret in them). Credentials before the
    host (``kafka://user:password@host``) are refused: they belong in the SASL settings.

    >>> parse_broker_url("kafka://a:9092,b:9092")
    ('kafka', ['a:9092', 'b:9092'])
    >>> parse_broker_url("memory://")
    ('memory', [])
    >>> parse_broker_url("kafka://shop:hunter2@k1:9092")
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: broker URL 'kafka://***@k1:9092': credentials do not go before the host; give them as the sasl_plain_username and sasl_plain_password settings (see the Security section of the Kafka docs)
    """  # noqa: E501
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"malformed broker URL {redact(url)!r}: expected memory:// or kafka://host:port"
        )
    shown = redact(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unknown broker scheme {scheme!r} in {shown!r}: use memory:// or kafka://"
        )
    rest = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in rest:
        # Refused rather than used: a password in the URL ends up in shell histories,
        # process listings and other tools' logs, wherever the URL is passed on.
        raise ConfigurationError(
            f"broker URL {shown!r}: credentials do not go before the host; give them as the"
            " sasl_plain_username and sasl_plain_password settings (see the Security"
            " section of the Kafka docs)"
        )
    if scheme == "memory":
        if rest:
            raise ConfigurationError(f"malformed broker URL {shown!r}: memory:// takes no host")
        return scheme, []
    servers = [s.strip() for s in rest.split(",") if s.strip()]
    if not servers:
        raise ConfigurationError(f"malformed broker URL {shown!r}: no host:port after kafka://")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"malformed broker URL {shown!r}: {server!r} is not host:port")
    return scheme, servers


def url_settings(url: str) -> dict[str, Any]:
    """Client settings given in the URL's query string, with numbers made numbers.

    >>> url_settings("kafka://h:9092?linger_ms=5&compression_type=gzip&acks=all")
    {'linger_ms': 5, 'compression_type': 'gzip', 'acks': 'all'}
    """
    settings: dict[str, Any] = {}
    for name, values in parse_qs(urlsplit(url).query, keep_blank_values=True).items():
        value: Any = values[-1]
        if name in _TEXT_SETTINGS or name.startswith(("ssl_", "sasl_")):
            pass  # names, ids and secrets stay text, even when they look like numbers
        elif value.lower() == "none":
            value = None
        elif value.lstrip("-").isdigit():
            value = int(value)
        else:
            try:
                value = float(value)
            except ValueError:
                pass
        settings[name] = value
    return settings


def transport_from_url(url: str, **settings: Any) -> Transport:
    """The transport for ``url``; ``settings`` (and the URL's query string, which they
    override) pass through to the client (Kafka only). The ``client`` setting chooses
    the Kafka client: ``aiokafka`` (the default) or ``rdkafka`` (confluent-kafka).

    >>> transport_from_url("memory://").url
    'memory://'
    >>> transport_from_url("kafka://h:9092?client=kafka-python")
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: unknown Kafka client 'kafka-python' (known: ...)
    """
    scheme, servers = parse_broker_url(url)
    settings = {**url_settings(url), **settings}
    if scheme == "memory":
        if settings:
            raise ConfigurationError(
                f"memory:// takes no client settings (got {', '.join(sorted(settings))})"
            )
        return MemoryTransport()
    client = settings.pop("client", "aiokafka")
    if client not in CLIENTS:
        raise ConfigurationError(f"unknown Kafka client {client!r} (known: {', '.join(CLIENTS)})")
    if client == "rdkafka":
        try:
            from .rdkafka import RdkafkaTransport  # imported here: confluent-kafka is optional
        except ImportError as exc:
            raise ConfigurationError(
                f"client=rdkafka needs confluent-kafka: pip install 'flowkit[rdkafka]' ({exc})"
            ) from exc
        return RdkafkaTransport(servers, **settings)
    from .kafka import KafkaTransport  # imported here so aiokafka loads only for kafka://

    return KafkaTransport(servers, **settings)
