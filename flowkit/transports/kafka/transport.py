"""``KafkaTransport``: the settings checked once, clients made with them, connecting with
retries, and topic administration.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiokafka.errors as kerr
import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.conn import create_conn
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.protocol.admin import ApiVersionRequest

from ...errors import BrokerUnavailable, ConfigurationError, TransportError
from .._kafka_common import (
    authentication_failed,
    certificate_refused,
    create_missing,
    timestamp_bounds,
    tls_reason,
    topic_config,
)
from ..base import OffsetReset, TimestampBounds, TopicSpec
from ..watch import BrokerWatch
from .consumer import KafkaConsumer
from .errors import map_kafka_errors
from .producer import KafkaProducer, KafkaTransactionalProducer
from .security import security_options
from .settings import KINDS, check_settings

__all__ = ["KafkaTransport"]

log = structlog.get_logger(__name__)

CLOSE_WHILE_AWAY = 3.0  # seconds a client may take to close while the broker is away
# How long a transaction may stay open before the broker aborts it (Kafka Streams' default
# for exactly-once): what a killed worker's open transaction holds back read_committed
# readers for, at most.
TRANSACTION_TIMEOUT_MS = 10_000


def _not_a_retried_leader(record: logging.LogRecord) -> bool:
    # aiokafka logs a partition leader that is not ready yet at ERROR, then retries the
    # request, which succeeds: Apache Kafka answers so for a moment after it creates a
    # topic (its metadata shows the partition before the leader serves it) and after a
    # restart. The retry is the answer; the line would only alarm.
    message = record.getMessage()
    return not (
        message.startswith("Failed fetch offsets")
        and ("NotLeaderForPartitionError" in message or "LeaderNotAvailableError" in message)
    )


logging.getLogger("aiokafka.consumer.fetcher").addFilter(_not_a_retried_leader)


Refusal = Callable[[str], Awaitable[ConfigurationError | None]]
"""Shakes hands with one broker: the error if it refuses the client's credentials or
certificate, None otherwise."""


async def _connect(
    servers: Sequence[str],
    limit: float,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    refusal: Refusal | None = None,
) -> None:
    """``start`` an aiokafka client once a broker accepts TCP, retrying for ``limit`` s.

    Probing TCP first keeps aiokafka from logging an error per failed bootstrap. With
    ``refusal`` (a secured connection), the first broker that answers is asked for the
    handshake too, and one that refuses it ends the wait at once (``ConfigurationError``):
    aiokafka would retry a wrong password until ``limit``, logging each attempt.
    """
    loop = asyncio.get_running_loop()
    deadline, backoff, last = loop.time() + limit, 0.05, "timed out"
    try:
        while (remaining := deadline - loop.time()) > 0:
            unknown: list[str] = []
            try:
                async with asyncio.timeout(remaining):
                    for server in servers:
                        host, _, port = server.rpartition(":")
                        try:
                            _, writer = await asyncio.open_connection(host, int(port))
                        except OSError as exc:
                            last = exc.strerror or str(exc)
                            if isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_NONAME:
                                unknown.append(host)
                            continue
                        writer.close()
                        if refusal is not None and (refused := await refusal(server)):
                            raise refused
                        with map_kafka_errors():
                            await start()
                        return
            except TimeoutError:
                last = "timed out"
            except BrokerUnavailable as exc:
                last = str(exc)
            if len(unknown) == len(servers):
                # No name resolves, and waiting will not change that (a DNS hiccup is
                # EAI_AGAIN, which is retried): fail now, not after connect_timeout.
                names = ", ".join(repr(host) for host in unknown)
                raise BrokerUnavailable(
                    f"the Kafka broker host {names} does not resolve ({last}); check the broker URL"
                )
            if backoff == 0.05:
                log.warning("waiting for a Kafka broker", servers=servers, error=last)
            await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
            backoff = min(backoff * 2, 1.0)
    except BaseException:
        await stop()  # an aiokafka client that was never stopped warns when collected
        raise
    await stop()
    raise BrokerUnavailable(
        f"no Kafka broker at {','.join(servers)} ({last}; gave up after {limit:g} s,"
        " see the connect_timeout setting)"
    )


def _description(exc: kerr.KafkaError) -> str:
    description = getattr(exc, "description", None)
    return str(description).rstrip(".") if description else type(exc).__name__


async def _answers(conn: Any) -> bool:
    """Whether an authenticated connection answers a request (ApiVersions) without an
    error: a broker still waiting for the end of a refused SASL exchange answers
    ILLEGAL_SASL_STATE, then closes the connection."""
    versions: Any = ApiVersionRequest  # a list of versioned classes before aiokafka 0.13
    try:
        async with asyncio.timeout(10.0):
            answer = await conn.send(versions[0]() if isinstance(versions, list) else versions())
    except (OSError, TimeoutError, kerr.KafkaError):
        return False
    return getattr(answer, "error_code", 0) == 0


class KafkaTransport:
    """Consumers, producers and topic administration over aiokafka.

    ``settings`` are checked here (an unknown name or a bad value raises
    ``ConfigurationError``) and passed on to the aiokafka clients that take them.
    """

    def __init__(self, servers: list[str], **settings: Any) -> None:
        if not servers:
            raise ConfigurationError("KafkaTransport needs at least one host:port server")
        self.servers = list(servers)
        self.url = "kafka://" + ",".join(self.servers)
        s = check_settings(settings)
        opts = {kind: {k: s[k] for k in checks if k in s} for kind, checks in KINDS.items()}
        own = opts["flowkit"]
        self._connect_timeout = float(own["connect_timeout"])
        self.broker_watch = BrokerWatch(self.servers, float(own["broker_timeout"]))
        self._client_id: str | None = own.get("client_id")
        self._client: dict[str, Any] = {"bootstrap_servers": self.servers, **opts["client"]}
        self._producer, self._consumer = opts["producer"], opts["consumer"]
        self._group = opts["group"]
        self._client.update(security_options(s))
        self._admin: Any = None
        self._read_committed = False  # set by transactional_producer(): exactly-once
        self._opened: set[KafkaConsumer | KafkaProducer] = set()
        self._closed = False

    def _id(self, client_id: str) -> str:
        # The user's client_id setting names every client (quotas and broker logs key on
        # it); without one, each client keeps the name the worker gave it.
        return self._client_id or client_id

    @property
    def client_options(self) -> dict[str, Any]:
        """The options every aiokafka client of this transport is made with (servers,
        security, the client settings)."""
        return self._client

    def forget(self, client: KafkaConsumer | KafkaProducer) -> None:
        """``client`` is closed: ``close`` no longer closes it."""
        self._opened.discard(client)

    async def connect(
        self, start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
    ) -> None:
        """Run an aiokafka client's ``start``, retrying while no broker answers, and
        checking a secured listener's handshake first (its refusal is a clear error)."""
        secured = self._client.get("security_protocol", "PLAINTEXT") != "PLAINTEXT"
        refusal = self._refusal if secured else None
        await _connect(self.servers, self._connect_timeout, start, stop, refusal)

    async def _refusal(self, server: str) -> ConfigurationError | None:
        """Shake hands with ``server`` as the clients will (TLS, then SASL): the error if it
        refuses the certificate or the credentials; None if it accepts them, or if it cannot
        be reached (retried as any unreachable broker)."""
        host, _, port = server.rpartition(":")
        keys = ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_oauth_token_provider")
        try:
            conn = await create_conn(
                host,
                int(port),
                client_id=self._id("flowkit") + "-probe",
                sasl_plain_username=self._client.get("sasl_plain_username"),
                sasl_plain_password=self._client.get("sasl_plain_password"),
                **{key: self._client[key] for key in keys if key in self._client},
            )
        except ssl.SSLError as exc:
            return certificate_refused(server, tls_reason(exc))
        except (
            kerr.SaslAuthenticationFailed,
            kerr.UnsupportedSaslMechanismError,
            kerr.IllegalSaslStateError,
            kerr.AuthenticationFailedError,
        ) as exc:
            # A refused handshake carries the connection, not words: then the error's own.
            first = exc.args[0] if exc.args else None
            reason = first if isinstance(first, str) else _description(exc)
            return authentication_failed(server, self._client, reason)
        except (OSError, TimeoutError, kerr.KafkaError):
            return None
        try:
            if self._client.get("sasl_mechanism") == "OAUTHBEARER" and not await _answers(conn):
                # aiokafka takes the broker's refusal of a token (an error challenge, RFC
                # 7628) for success; the broker's reason is in its own log only.
                reason = "the broker refused the token (invalid, expired or not for it)"
                return authentication_failed(server, self._client, reason)
        finally:
            conn.close()
        return None

    def consumer(
        self,
        *,
        group_id: str | None,
        client_id: str = "flowkit",
        auto_offset_reset: OffsetReset = "earliest",
    ) -> KafkaConsumer:
        """A new consumer; ``group_id=None`` reads only what is ``assign``ed."""
        options = {
            **self._client,
            **self._consumer,
            **(self._group if group_id is not None else {}),
            "client_id": self._id(client_id),
            "group_id": group_id,
            "auto_offset_reset": auto_offset_reset,
            "enable_auto_commit": False,
        }
        if self._read_committed:
            options["isolation_level"] = "read_committed"
        if group_id is not None:
            # Range assignment gives the same partition numbers of every subscribed topic
            # to the same member: co-partitioned topics and tables stay together.
            options["partition_assignment_strategy"] = (RangePartitionAssignor,)
        consumer = KafkaConsumer(self, options)
        self._opened.add(consumer)
        return consumer

    def producer(self, *, client_id: str = "flowkit") -> KafkaProducer:
        """A new producer (never idempotent or transactional)."""
        producer = KafkaProducer(
            self, {**self._client, **self._producer, "client_id": self._id(client_id)}
        )
        self._opened.add(producer)
        return producer

    def transactional_producer(
        self, *, transactional_id: str, client_id: str = "flowkit"
    ) -> KafkaTransactionalProducer:
        """A producer that sends in transactions (idempotent, ``acks=all``); every consumer
        made from now on reads ``read_committed``."""
        self._read_committed = True
        options = {
            "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
            **self._client,
            **self._producer,
            "client_id": self._id(client_id),
            "transactional_id": transactional_id,
            "enable_idempotence": True,
            "acks": "all",
        }
        producer = KafkaTransactionalProducer(self, options)
        self._opened.add(producer)
        return producer

    async def _admin_client(self) -> Any:
        if self._closed:
            raise TransportError("the Kafka transport is closed")
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self._client, client_id=self._id("flowkit") + "-admin")
            await self.connect(admin.start, admin.close)
            self._admin = admin
        return self._admin

    async def _partition_counts(self) -> dict[str, int]:
        await self._admin_client()
        # Metadata of all topics: asking for a missing one by name creates it on some
        # brokers (Tansu; Kafka with auto.create.topics.enable).
        with map_kafka_errors():
            topics = await self._admin.describe_topics()
        return {t["topic"]: len(t["partitions"]) for t in topics if t["error_code"] == 0}

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create the topics that do not exist yet (``compacted`` sets cleanup.policy).

        Raises ``ConfigurationError`` if one exists with another partition count.
        """
        await create_missing(specs, self._partition_counts, self._create)

    async def _create(self, specs: list[TopicSpec], *, bounds: bool = True) -> None:
        new = [
            NewTopic(
                s.name,
                s.partitions,
                s.replication_factor,
                topic_configs=topic_config(s, bounds=bounds),
            )
            for s in specs
        ]
        with map_kafka_errors():
            response = await self._admin.create_topics(new)
        unbounded = []  # internal topics refused for their timestamp settings (Kafka < 3.6)
        for name, code, *rest in response.topic_errors:
            spec = next(s for s in specs if s.name == name)
            if code == kerr.InvalidConfigurationError.errno and spec.internal and bounds:
                unbounded.append(spec)
            elif code not in (0, kerr.TopicAlreadyExistsError.errno):
                detail = f"{kerr.for_code(code).__name__} {rest[0] if rest else ''}".strip()
                raise TransportError(f"could not create topic {name!r}: {detail}")
        if unbounded:
            await self._create(unbounded, bounds=False)

    async def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if it does not exist (never creates it)."""
        return (await self._partition_counts()).get(topic)

    async def timestamp_bounds(self, topic: str) -> TimestampBounds:
        """How far ahead of and behind now ``topic`` takes a timestamp, from its
        configuration; (None, None) if it cannot be read (not authorised, say)."""
        admin = await self._admin_client()
        try:
            with map_kafka_errors():
                responses = await admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, topic)]
                )
        except TransportError:
            return (None, None)
        for response in responses:
            for code, _, _, name, entries in response.resources:
                if code == 0 and name == topic:
                    return timestamp_bounds({entry[0]: entry[1] for entry in entries})
        return (None, None)

    async def watch(self) -> None:
        """Run until cancelled; raises ``BrokerUnavailable`` once the brokers have been
        unreachable for ``broker_timeout`` seconds (see ``BrokerWatch``)."""
        await self.broker_watch.run()

    def closing_limit(self) -> float | None:
        """How long closing a client may wait: unbounded normally, a few seconds while the
        broker is away (a producer would otherwise wait out its sends' timeout)."""
        return CLOSE_WHILE_AWAY if self.broker_watch.away else None

    async def disconnect(self, kafka: Any) -> None:
        """Stop an aiokafka client that ``connect`` started, within ``closing_limit``."""
        await _stop(kafka, self.closing_limit())

    async def __aenter__(self) -> KafkaTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every consumer and producer this transport made, and the admin client."""
        self._closed = True
        for client in list(self._opened):
            await client.aclose()
        admin, self._admin = self._admin, None
        if admin is not None:
            await _stop_admin(admin, self.closing_limit())
        self.broker_watch.close()


async def _stop_admin(admin: Any, limit: float | None) -> None:
    try:
        async with asyncio.timeout(limit):
            await admin.close()
    except TimeoutError:
        log.warning("the Kafka admin client did not close while the broker is away", limit=limit)


async def _stop(kafka: Any, limit: float | None) -> None:
    """Stop an aiokafka client; with a ``limit`` (the broker is away), give up waiting
    after it: a producer would otherwise wait out its pending sends' timeout."""
    try:
        with map_kafka_errors():
            if limit is None:
                await kafka.stop()
            else:
                async with asyncio.timeout(limit):
                    await kafka.stop()
    except TimeoutError:
        log.warning("a Kafka client did not close while the broker is away", limit=limit)
