"""``RdkafkaTransport``: the settings checked once, librdkafka clients made with them,
connecting with a deadline, and topic administration.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import confluent_kafka as ck
import structlog
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # (not in its stubs' exports)
    AdminClient,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from ...errors import BrokerUnavailable, ConfigurationError, TransportError
from .._kafka_common import (
    authentication_failed,
    certificate_refused,
    client_reason,
    create_missing,
    timestamp_bounds,
    tls_context,
    tls_refusal,
    topic_config,
)
from ..base import OffsetReset, TimestampBounds, TopicSpec
from ..watch import BrokerWatch
from .consumer import RdkafkaConsumer
from .errors import RDKAFKA_ERRORS, map_rdkafka_errors
from .producer import RdkafkaProducer, RdkafkaTransactionalProducer
from .settings import check_settings, client_config

# How long a transaction may stay open before the broker aborts it (as for aiokafka).
TRANSACTION_TIMEOUT_MS = 10_000

__all__ = ["RdkafkaTransport"]

log = structlog.get_logger(__name__)
CLOSE_WHILE_AWAY = 3.0  # seconds a client may take to close while the broker is away

# librdkafka's own log lines (connection failures, ...) go to this stdlib logger.
_LIBRDKAFKA_LOG = logging.getLogger("flowkit.transports.rdkafka.librdkafka")
# confluent-kafka hands a client's log lines to the logger in the thread that polls it: while
# connecting, its per-attempt failures are the connect loop's to report (once), not logged.
_QUIET = threading.local()


def _worth_logging(record: logging.LogRecord) -> bool:
    # A broker connection that failed (librdkafka's FAIL lines) is the broker watch's to
    # report, once, if it lasts: error_cb hints it. Logged, one reset under load would
    # print an ERROR line while nothing is wrong.
    return not getattr(_QUIET, "on", False) and not record.getMessage().startswith("FAIL ")


_LIBRDKAFKA_LOG.addFilter(_worth_logging)


# librdkafka's codes for "a broker connection failed" and "no broker is reachable".
_CONNECTION_ERRORS = (ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN)
# ...and for a broker that refused the client: its credentials, or TLS (the certificate).
_REFUSALS = (ck.KafkaError._AUTHENTICATION, ck.KafkaError._SSL)


def _poll_quietly(client: Any) -> None:
    """Serve ``client``'s queued callbacks (errors, logs), its log lines dropped."""
    _QUIET.on = True
    try:
        client.poll(0)
    finally:
        _QUIET.on = False


class RdkafkaTransport:
    """Consumers, producers and topic administration over confluent-kafka (librdkafka).

    Takes the same settings as the aiokafka transport (plus ``fetch_queue_backoff_ms`` and
    ``queued_max_messages_kbytes``); they are checked here (an unknown name or a bad value
    raises ``ConfigurationError``) and set on the librdkafka clients that take them.
    """

    def __init__(self, servers: list[str], **settings: Any) -> None:
        if not servers:
            raise ConfigurationError("RdkafkaTransport needs at least one host:port server")
        self.servers = list(servers)
        self.url = "kafka://" + ",".join(self.servers) + "?client=rdkafka"
        self._settings = s = check_settings(settings)
        if "SSL" in s.get("security_protocol", ""):
            tls_context(s)  # a file librdkafka could not read, refused here in one line
        self.connect_timeout = float(s["connect_timeout"])
        self.broker_watch = BrokerWatch(self.servers, float(s["broker_timeout"]))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client_id: str | None = s.get("client_id")
        self._base: dict[str, Any] = {
            "bootstrap.servers": ",".join(self.servers),
            "logger": _LIBRDKAFKA_LOG,
            "log.connection.close": False,
            "error_cb": self.on_error,
        }
        self._admin: Any = None
        self._read_committed = False  # set by transactional_producer(): exactly-once
        self._opened: set[RdkafkaConsumer | RdkafkaProducer] = set()
        self._closed = False
        self._refused: str | None = None  # the last refusal a client reported

    @property
    def settings(self) -> dict[str, Any]:
        """The transport's settings, checked (``client_config`` makes a client's of them)."""
        return self._settings

    @property
    def base_config(self) -> dict[str, Any]:
        """What every librdkafka client of this transport is configured with first."""
        return self._base

    def client_id(self, client_id: str) -> str:
        """The ``client.id`` of a client the worker names ``client_id``: the user's
        client_id setting names every client (quotas and broker logs key on it)."""
        return self._client_id or client_id

    def forget(self, client: RdkafkaConsumer | RdkafkaProducer) -> None:
        """``client`` is closed: ``close`` no longer closes it."""
        self._opened.discard(client)

    def on_error(self, error: Any) -> None:
        """librdkafka's error callback, called in its thread: a lost connection is a hint
        for the watch, which checks and reports on the event loop (see
        flowkit.transports.watch); a refusal is kept for ``_refusal``."""
        if error.code() in _REFUSALS:
            self._refused = error.str()
        loop = self._loop
        if loop is not None and error.code() in _CONNECTION_ERRORS:
            loop.call_soon_threadsafe(self.broker_watch.hint)

    async def _refusal(self, client: Any) -> ConfigurationError | None:
        """After a failed connect: the error if a broker refused the client's credentials
        or certificate (librdkafka would retry them for ever), else None."""
        protocol = self._settings.get("security_protocol", "PLAINTEXT")
        if protocol == "PLAINTEXT":
            return None
        if "SSL" in protocol:  # Python's TLS names the certificate problem precisely
            context = tls_context(self._settings)
            for server in self.servers:
                if refused := await tls_refusal(server, context, timeout=5.0):
                    return refused
        await asyncio.get_running_loop().run_in_executor(None, _poll_quietly, client)
        reason, self._refused = self._refused, None
        if reason is None:
            return None
        # librdkafka names the broker ("sasl_plaintext://host:port/1: ...") unless the
        # token could not be had at all (OAUTHBEARER: no broker was asked yet).
        server = reason.split("://", 1)[1].split("/", 1)[0] if "://" in reason else self.servers[0]
        if "SSL" in reason and "authentication" not in reason.lower():
            return certificate_refused(server, client_reason(reason))
        reason = client_reason(reason).removeprefix("SASL authentication error: ")
        return authentication_failed(server, self._settings, reason)

    def closing_limit(self) -> float | None:
        """How long closing a client may wait: unbounded normally, a few seconds while the
        broker is away (a flush would wait out librdkafka's message timeout, a revocation
        its commit)."""
        return CLOSE_WHILE_AWAY if self.broker_watch.away else None

    async def watch(self) -> None:
        """Run until cancelled; raises ``BrokerUnavailable`` once the brokers have been
        unreachable for ``broker_timeout`` seconds (see ``BrokerWatch``)."""
        self._loop = asyncio.get_running_loop()
        await self.broker_watch.run()

    async def connect(self, client: Any) -> None:
        """Wait until ``client`` reaches a broker, at most ``connect_timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        first = True
        if "sasl_oauth_token_provider" in self._settings:
            # librdkafka asks oauth_cb for a token only within a poll: one before the wait.
            await loop.run_in_executor(None, _poll_quietly, client)
        while True:
            limit = deadline - loop.time()
            wait = max(min(limit, 1.0) if first else limit, 0.01)
            try:
                await loop.run_in_executor(
                    None, functools.partial(client.list_topics, timeout=wait)
                )
                return
            except RDKAFKA_ERRORS as exc:
                if refused := await self._refusal(client):
                    raise refused from None
                last = str(exc.args[0].str() if exc.args else exc)
                if loop.time() >= deadline:
                    raise BrokerUnavailable(
                        f"no Kafka broker at {','.join(self.servers)} ({last}; gave up after"
                        f" {self.connect_timeout:g} s, see the connect_timeout setting)"
                    ) from exc
                if first:
                    log.warning("waiting for a Kafka broker", servers=self.servers, error=last)
                first = False

    def consumer(
        self,
        *,
        group_id: str | None,
        client_id: str = "flowkit",
        auto_offset_reset: OffsetReset = "earliest",
    ) -> RdkafkaConsumer:
        """A new consumer; ``group_id=None`` reads only what is ``assign``ed."""
        config = {
            **self._base,
            **client_config(self._settings, "consumer" if group_id is None else "group"),
            "client.id": self.client_id(client_id),
            # librdkafka needs a group.id even for a consumer that only assigns; such a
            # consumer never joins the group nor commits.
            "group.id": group_id
            if group_id is not None
            else f"{self.client_id(client_id)}-assigned",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": auto_offset_reset,
            "enable.partition.eof": False,
            # Range assignment gives the same partition numbers of every subscribed topic
            # to the same member: co-partitioned topics and tables stay together.
            "partition.assignment.strategy": "range",
        }
        budget = None
        if self._read_committed:
            config["isolation.level"] = "read_committed"
            if group_id is not None:
                # A checkpoint's transaction waits for every batch handed to the agents:
                # a getmany hands over at most a fetch's bytes of a partition, not all
                # that librdkafka read ahead (see consumer.py).
                budget = int(config["max.partition.fetch.bytes"])
        consumer = RdkafkaConsumer(self, config, group_id, auto_offset_reset, budget)
        self._opened.add(consumer)
        return consumer

    def producer(self, *, client_id: str = "flowkit") -> RdkafkaProducer:
        """A new producer (never idempotent or transactional)."""
        config = {
            **self._base,
            **client_config(self._settings, "producer"),
            "client.id": self.client_id(client_id),
            "partitioner": "murmur2_random",  # Kafka's default partitioner, as aiokafka's
            "enable.idempotence": False,
        }
        producer = RdkafkaProducer(self, config)
        self._opened.add(producer)
        return producer

    def transactional_producer(
        self, *, transactional_id: str, client_id: str = "flowkit"
    ) -> RdkafkaTransactionalProducer:
        """A producer that sends in transactions (idempotent, ``acks=all``); every consumer
        made from now on reads ``read_committed``."""
        self._read_committed = True
        config = {
            **self._base,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            **client_config(self._settings, "producer"),
            "client.id": self.client_id(client_id),
            "partitioner": "murmur2_random",
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
        }
        producer = RdkafkaTransactionalProducer(self, config)
        self._opened.add(producer)
        return producer

    async def _admin_client(self) -> Any:
        if self._closed:
            raise TransportError("the Kafka transport is closed")
        if self._admin is None:
            admin = AdminClient(
                {
                    **self._base,
                    **client_config(self._settings, "admin"),
                    "client.id": self.client_id("flowkit") + "-admin",
                }
            )
            await self.connect(admin)
            self._admin = admin
        return self._admin

    async def _partition_counts(self) -> dict[str, int]:
        admin, timeout = await self._admin_client(), self.connect_timeout
        loop = asyncio.get_running_loop()
        # Metadata of all topics: asking for a missing one by name creates it on some
        # brokers (Tansu; Kafka with auto.create.topics.enable).
        with map_rdkafka_errors():
            metadata = await loop.run_in_executor(None, lambda: admin.list_topics(timeout=timeout))
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create the topics that do not exist yet (``compacted`` sets cleanup.policy).

        Raises ``ConfigurationError`` if one exists with another partition count.
        """
        await create_missing(specs, self._partition_counts, self._create)

    async def _create(self, specs: list[TopicSpec], *, bounds: bool = True) -> None:
        new = [
            NewTopic(
                s.name, s.partitions, s.replication_factor, config=topic_config(s, bounds=bounds)
            )
            for s in specs
        ]
        futures = self._admin.create_topics(new, request_timeout=self.connect_timeout)
        unbounded = []  # internal topics refused for their timestamp settings (Kafka < 3.6)
        for name, future in futures.items():
            try:
                await asyncio.wrap_future(future)
            except ck.KafkaException as exc:
                error = exc.args[0]
                spec = next(s for s in specs if s.name == name)
                if error.code() == ck.KafkaError.INVALID_CONFIG and spec.internal and bounds:
                    unbounded.append(spec)
                elif error.code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise TransportError(
                        f"could not create topic {name!r}: {error.name()} {error.str()}"
                    ) from exc
        if unbounded:
            await self._create(unbounded, bounds=False)

    async def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if it does not exist (never creates it)."""
        return (await self._partition_counts()).get(topic)

    async def timestamp_bounds(self, topic: str) -> TimestampBounds:
        """How far ahead of and behind now ``topic`` takes a timestamp, from its
        configuration; (None, None) if it cannot be read (not authorised, say)."""
        admin = await self._admin_client()
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            [future] = admin.describe_configs(
                [resource], request_timeout=self.connect_timeout
            ).values()
            entries = await asyncio.wrap_future(future)
        except (ck.KafkaException, ValueError):
            return (None, None)
        return timestamp_bounds({name: entry.value for name, entry in entries.items()})

    async def __aenter__(self) -> RdkafkaTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every consumer and producer this transport made, and the admin client."""
        self._closed = True
        for client in list(self._opened):
            await client.aclose()
        self._admin = None
