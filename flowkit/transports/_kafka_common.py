"""What the two Kafka clients' transports share: the checks of their settings (names,
values, and the heartbeat, SSL and SASL combinations), the room a dead letter needs, the
shape of topic creation (create what is missing, check the partition counts before and
after), and the one-line errors for a broker that refuses the client's credentials or
certificate. Imports neither client library, so each transport stays the only importer of
its own.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigurationError
from ..redaction import MASK, is_secret
from .base import TimestampBounds, TopicSpec

__all__ = [
    "ACKS",
    "CALLABLE",
    "COMPRESSION",
    "DEAD_LETTER_ROOM",
    "HTTP_URL",
    "ISOLATION",
    "NONNEG",
    "OIDC_SETTINGS",
    "POS",
    "SASL_MECHANISM",
    "SECONDS",
    "SECURITY_PROTOCOL",
    "STR",
    "Check",
    "authentication_failed",
    "certificate_refused",
    "check_counts",
    "check_heartbeat",
    "check_security",
    "check_values",
    "client_reason",
    "create_missing",
    "int_at_least",
    "one_of",
    "timestamp_bounds",
    "tls_context",
    "tls_reason",
    "tls_refusal",
    "topic_config",
]

# What a dead letter adds to the record it carries: flowkit.* headers with a bounded error
# message and traceback. The producer's max_request_size defaults to the largest record the
# consumer fetches plus this, so whatever the worker reads it can also dead-letter.
DEAD_LETTER_ROOM = 64 * 1024

Check = tuple[Callable[[Any], bool], str]
"""A setting's check: a predicate and what it expects, for the error message."""


def int_at_least(low: int) -> Check:
    """An int, ``low`` or more (``True`` is not an int here)."""
    return (lambda v: type(v) is int and v >= low), f"an int >= {low}"


def one_of(*choices: object) -> Check:
    """One of ``choices``, of the same type (``1`` is not ``True``)."""
    names = ", ".join(map(repr, choices))
    return (lambda v: any(v == c and type(v) is type(c) for c in choices)), f"one of {names}"


STR: Check = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
SECONDS: Check = (lambda v: type(v) in (int, float) and v > 0, "a positive number of seconds")
POS, NONNEG = int_at_least(1), int_at_least(0)
SECURITY_PROTOCOL = one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISM = one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
HTTP_URL: Check = (
    lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
    "an http:// or https:// URL",
)
CALLABLE: Check = (callable, "a callable (see the Security section of the Kafka docs)")
# The OIDC client-credentials settings: a token endpoint, and who the client is there.
OIDC_SETTINGS = (
    "sasl_oauth_token_endpoint_url",
    "sasl_oauth_client_id",
    "sasl_oauth_client_secret",
    "sasl_oauth_scope",
)
ACKS = one_of(0, 1, -1, "all")
COMPRESSION = one_of(None, "gzip", "snappy", "lz4", "zstd")
ISOLATION = one_of("read_uncommitted", "read_committed")


def check_values(settings: Mapping[str, Any], checks: Mapping[str, Check], client: str) -> None:
    """Raise ``ConfigurationError`` for the first setting that ``checks`` does not know,
    or whose value its check refuses; ``client`` names the settings in the message.

    >>> check_values({"linger": 2}, {"linger_ms": NONNEG}, "Kafka")
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: unknown Kafka setting 'linger' (known: linger_ms)
    """
    for name, value in settings.items():
        if name not in checks:
            known = ", ".join(sorted(checks))
            raise ConfigurationError(f"unknown {client} setting {name!r} (known: {known})")
        ok, expected = checks[name]
        if not ok(value):
            shown = MASK if is_secret(name) else repr(value)
            raise ConfigurationError(f"{client} setting {name}={shown}: expected {expected}")


def check_heartbeat(settings: Mapping[str, Any], client: str, session_default_ms: int) -> None:
    """The heartbeat must come more often than the session times out (each client has its
    own default session timeout)."""
    if settings.get("heartbeat_interval_ms", 3000) >= settings.get(
        "session_timeout_ms", session_default_ms
    ):
        raise ConfigurationError(
            f"{client} setting heartbeat_interval_ms must be < session_timeout_ms"
        )


def check_security(settings: Mapping[str, Any]) -> None:
    """``ssl_*`` files need an SSL protocol, a key password needs the key, and a SASL
    protocol needs the credentials of its mechanism: a user name and password, or for
    OAUTHBEARER either a token provider or the OIDC client-credentials settings.

    >>> check_security({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"})
    Traceback (most recent call last):
    flowkit.errors.ConfigurationError: sasl_mechanism=OAUTHBEARER needs sasl_oauth_token_provider, or sasl_oauth_token_endpoint_url, sasl_oauth_client_id and sasl_oauth_client_secret
    """  # noqa: E501
    protocol = settings.get("security_protocol", "PLAINTEXT")
    if "SSL" not in protocol and any(name.startswith("ssl_") for name in settings):
        raise ConfigurationError(f"ssl_* Kafka settings need security_protocol SSL, not {protocol}")
    if "ssl_key_password" in settings and "ssl_certfile" not in settings:
        raise ConfigurationError(
            "Kafka setting ssl_key_password needs ssl_certfile (and ssl_keyfile, unless the"
            " key is in the certificate file)"
        )
    mechanism = settings.get("sasl_mechanism", "PLAIN")
    oauth = [name for name in settings if name.startswith("sasl_oauth_")]
    if oauth and (mechanism != "OAUTHBEARER" or not protocol.startswith("SASL")):
        raise ConfigurationError(
            f"Kafka settings {', '.join(oauth)} need sasl_mechanism=OAUTHBEARER and"
            f" security_protocol SASL_SSL or SASL_PLAINTEXT (not {mechanism}, {protocol})"
        )
    if not protocol.startswith("SASL"):
        return
    if mechanism != "OAUTHBEARER":
        if not ("sasl_plain_username" in settings and "sasl_plain_password" in settings):
            raise ConfigurationError(
                f"security_protocol={protocol} needs sasl_plain_username/password"
            )
        return
    provider = "sasl_oauth_token_provider" in settings
    oidc = [name for name in OIDC_SETTINGS if name in settings]
    needed = ", ".join(OIDC_SETTINGS[:2]) + " and " + OIDC_SETTINGS[2]
    if provider and oidc:
        raise ConfigurationError(
            f"Kafka settings: give sasl_oauth_token_provider or the OIDC settings ({needed}),"
            f" not both (got {', '.join(oidc)})"
        )
    if not provider and not set(OIDC_SETTINGS[:3]) <= set(oidc):
        raise ConfigurationError(
            f"sasl_mechanism=OAUTHBEARER needs sasl_oauth_token_provider, or {needed}"
        )


def check_counts(specs: Iterable[TopicSpec], existing: Mapping[str, int]) -> None:
    """Raise ``ConfigurationError`` for each spec whose topic exists with another count."""
    problems = [
        f"topic {s.name!r} exists with {existing[s.name]} partitions,"
        f" the app declares {s.partitions}"
        for s in specs
        if existing.get(s.name, s.partitions) != s.partitions
    ]
    if problems:
        raise ConfigurationError("; ".join(dict.fromkeys(problems)))


# Kafka 3.6 and later bound a record's timestamp per topic (KIP-937), and 4.0 refuses one
# over an hour ahead by default. A topic flowkit makes for itself takes any: its records'
# timestamps are those of records some topic took already.
ANY_TIMESTAMP = {
    "message.timestamp.after.max.ms": str(2**63 - 1),
    "message.timestamp.before.max.ms": str(2**63 - 1),
}


def timestamp_bounds(config: Mapping[str, str | None]) -> TimestampBounds:
    """How far ahead of and behind the broker's clock a topic takes a record's timestamp,
    in ms (None: no bound), from its configuration.

    >>> timestamp_bounds({"message.timestamp.after.max.ms": "3600000",
    ...                   "message.timestamp.before.max.ms": str(2**63 - 1)})
    (3600000, None)
    >>> timestamp_bounds({"message.timestamp.type": "LogAppendTime",
    ...                   "message.timestamp.after.max.ms": "3600000"})
    (None, None)
    >>> timestamp_bounds({"message.timestamp.difference.max.ms": "60000"})  # Kafka < 3.6
    (60000, 60000)
    """

    def bound(name: str) -> int | None:
        value = config.get(name)
        try:
            ms = int(value) if value is not None else None
        except ValueError:
            return None
        return ms if ms is not None and 0 <= ms < 2**63 - 1 else None

    if config.get("message.timestamp.type") == "LogAppendTime":
        return (None, None)  # the broker stamps every record itself
    either = bound("message.timestamp.difference.max.ms")
    ahead = bound("message.timestamp.after.max.ms")
    behind = bound("message.timestamp.before.max.ms")
    if "message.timestamp.after.max.ms" not in config:
        ahead = either
    if "message.timestamp.before.max.ms" not in config:
        behind = either
    return (ahead, behind)


def topic_config(spec: TopicSpec, *, bounds: bool = True) -> dict[str, str]:
    """The topic configuration to create ``spec`` with: ``compacted`` sets cleanup.policy;
    ``internal`` lifts the timestamp bounds (unless ``bounds`` is False: a broker before
    Kafka 3.6 knows no such setting, and bounds nothing)."""
    config = {**spec.config, **({"cleanup.policy": "compact"} if spec.compacted else {})}
    if spec.internal and bounds:
        config = {**ANY_TIMESTAMP, **config}
    return config


async def create_missing(
    specs: Sequence[TopicSpec],
    counts: Callable[[], Awaitable[Mapping[str, int]]],
    create: Callable[[list[TopicSpec]], Awaitable[None]],
    *,
    visible_within: float = 10.0,
) -> None:
    """Create the topics of ``specs`` that do not exist yet, with ``create`` (the client's
    admin call); ``counts`` reads the partition count of every existing topic.

    Returns once the created topics show in the metadata (for at most ``visible_within``
    seconds): Apache Kafka acknowledges a creation before its brokers serve the topic, and a
    consumer that subscribed meanwhile would join its group without it, then rebalance.
    Raises ``ConfigurationError`` if one exists with another partition count: before, or
    after the creation (another worker may have created one meanwhile).
    """
    existing = await counts()
    check_counts(specs, existing)
    missing = {s.name: s for s in specs if s.name not in existing}
    if not missing:
        return
    await create(list(missing.values()))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + visible_within
    existing = await counts()
    while not missing.keys() <= existing.keys() and loop.time() < deadline:
        await asyncio.sleep(0.05)
        existing = await counts()
    check_counts(missing.values(), existing)


# -- a broker that refuses the client -------------------------------------------------------
# Kafka's clients retry a refused handshake like a lost connection, for ever; a wrong
# password or an untrusted certificate will not heal by waiting, so the transports stop at
# the first refusal with one of these (shown by the CLI as one ``Error:`` line, exit 2).


def authentication_failed(
    server: str, settings: Mapping[str, Any], reason: str
) -> ConfigurationError:
    """The error for a broker that refused the SASL credentials; ``reason`` is the broker's.

    >>> print(authentication_failed("k1:9094", {"sasl_mechanism": "SCRAM-SHA-512",
    ...     "sasl_plain_username": "shop"}, "invalid credentials"))
    Kafka authentication failed at k1:9094 (SCRAM-SHA-512, user 'shop'): invalid credentials; check sasl_plain_username and sasl_plain_password
    >>> print(authentication_failed("k1:9094", {"sasl_mechanism": "OAUTHBEARER"}, "invalid_token"))
    Kafka authentication failed at k1:9094 (OAUTHBEARER): invalid_token; check the token the sasl_oauth_* settings give
    """  # noqa: E501
    mechanism = settings.get("sasl_mechanism", "PLAIN")
    user = settings.get("sasl_plain_username")
    who = "" if mechanism == "OAUTHBEARER" else f", user {user!r}"
    if "unsupported sasl mechanism" in reason.lower() or "not support" in reason.lower():
        check = "sasl_mechanism"
    elif mechanism == "OAUTHBEARER":
        check = "the token the sasl_oauth_* settings give"
    else:
        check = "sasl_plain_username and sasl_plain_password"
    return ConfigurationError(
        f"Kafka authentication failed at {server} ({mechanism}{who}): {reason}; check {check}"
    )


def certificate_refused(server: str, reason: str) -> ConfigurationError:
    """The error for a TLS handshake that failed on the broker's certificate.

    >>> print(certificate_refused("k1:9093", "certificate verify failed: certificate has expired"))
    TLS handshake with the Kafka broker at k1:9093 failed: certificate verify failed: certificate has expired; see the ssl_cafile setting
    """  # noqa: E501
    return ConfigurationError(
        f"TLS handshake with the Kafka broker at {server} failed: {reason};"
        " see the ssl_cafile setting"
    )


def tls_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """The client's TLS context from the ``ssl_*`` settings: trusting ``ssl_cafile`` (else
    the system's CAs), with the client certificate ``ssl_certfile`` and its key
    (``ssl_keyfile``, decrypted with ``ssl_key_password``) if given. A file that cannot be
    read or a key that cannot be decrypted is a one-line ``ConfigurationError``, never a
    password prompt."""
    keyfile = settings.get("ssl_keyfile")
    try:
        context = ssl.create_default_context(cafile=settings.get("ssl_cafile"))
        if "ssl_certfile" in settings:
            # A callable, so that OpenSSL never asks on the terminal for a missing password.
            password = settings.get("ssl_key_password", "")
            context.load_cert_chain(settings["ssl_certfile"], keyfile, password=lambda: password)
    except ssl.SSLError as exc:
        if exc.reason in ("PEM_LIB", "BAD_DECRYPT", "BAD_PASSWORD_READ") or "PEM lib" in str(exc):
            key = keyfile or settings["ssl_certfile"]
            raise ConfigurationError(
                f"Kafka ssl_* settings: cannot load the client key from {key}: a wrong or"
                " missing ssl_key_password, or not a PEM key"
            ) from None
        raise ConfigurationError(f"Kafka ssl_* settings: {exc}") from None
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"Kafka ssl_* settings: {exc}") from None
    return context


def tls_reason(exc: ssl.SSLError) -> str:
    """What a failed TLS handshake failed on, in words."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    return str(exc.reason or exc).replace("_", " ").lower()


async def tls_refusal(
    server: str, context: ssl.SSLContext, timeout: float
) -> ConfigurationError | None:
    """Shake hands with ``server`` over TLS: the error if the handshake itself fails (an
    untrusted, expired or misnamed certificate), None if it succeeds or the broker cannot be
    reached (that is retried as any unreachable broker is)."""
    host, _, port = server.rpartition(":")
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, int(port), ssl=context)
    except ssl.SSLError as exc:
        return certificate_refused(server, tls_reason(exc))
    except (OSError, TimeoutError):
        return None
    writer.close()
    return None


_RDKAFKA_NOISE = re.compile(r"^\S+://\S+: |\s*\(after \d+ms in state \w+\)$")


def client_reason(text: str) -> str:
    """A client's error text without the connection prefix and state suffix librdkafka adds.

    >>> client_reason("sasl_ssl://k1:9094/bootstrap: SASL authentication error: denied"
    ...     " (after 5ms in state AUTH_REQ)")
    'SASL authentication error: denied'
    """
    return _RDKAFKA_NOISE.sub("", text)
