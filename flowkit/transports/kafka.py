"""The Kafka transport: a thin mapping of the transport protocol onto aiokafka.

This is the only flowkit module that imports aiokafka. Its exceptions are translated into
``flowkit.errors`` in one place (``map_kafka_errors``) and its types never leak.

>>> transport = KafkaTransport(["127.0.0.1:9092"], linger_ms=2)
>>> transport.url
'kafka://127.0.0.1:9092'

Defaults, chosen for a stream processor rather than aiokafka's request/response use:

- ``fetch_max_wait_ms=50`` (aiokafka: 500): the longest an empty fetch waits. Some brokers
  (Tansu) do not end a long-poll early when data arrives, so this bounds latency.
- ``max_partition_fetch_bytes=4 MiB`` (aiokafka: 1 MiB): more records per round trip.
- ``acks="all"`` (aiokafka: 1): an ack means every in-sync replica has the record, which is
  what committing offsets after acks (at-least-once) assumes.
- ``linger_ms=5``, ``max_batch_size=256 KiB``: batched sends; ``flush`` skips the linger.
- ``connect_timeout=10`` (seconds): how long ``start`` retries an unreachable broker before
  ``BrokerUnavailable``.
- Auto-commit is off; idempotence and transactions are never enabled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import aiokafka
import aiokafka.errors as kerr
import structlog
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.helpers import create_ssl_context

from ..errors import BrokerUnavailable, CommitFailed, ConfigurationError, TransportError
from ..records import Headers, Message, TopicPartition
from .base import Ack, OffsetReset, RebalanceListener, TopicSpec

__all__ = ["KafkaConsumer", "KafkaProducer", "KafkaTransport", "map_kafka_errors"]

log = structlog.get_logger(__name__)

_KTP = aiokafka.TopicPartition
_ALL_ERRORS = (kerr.KafkaError, kerr.ConsumerStoppedError, kerr.IllegalOperation)
_COMMIT_ERRORS = (
    kerr.CommitFailedError,
    kerr.RebalanceInProgressError,
    kerr.IllegalGenerationError,
    kerr.UnknownMemberIdError,
)
_UNAVAILABLE_ERRORS = (
    kerr.KafkaConnectionError,
    kerr.NodeNotReadyError,
    kerr.NoBrokersAvailable,
    kerr.KafkaUnavailableError,
    kerr.KafkaTimeoutError,
)

# --- settings ----------------------------------------------------------------------------

_Check = tuple[Callable[[Any], bool], str]


def _int(low: int) -> _Check:
    return (lambda v: type(v) is int and v >= low), f"an int >= {low}"


def _one_of(*choices: object) -> _Check:
    names = ", ".join(map(repr, choices))
    return (lambda v: any(v == c and type(v) is type(c) for c in choices)), f"one of {names}"


_STR: _Check = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_SECONDS: _Check = (lambda v: type(v) in (int, float) and v > 0, "a positive number of seconds")
_POS, _NONNEG = _int(1), _int(0)

# Which client takes each setting; the "flowkit" ones are used here, not passed on as such.
_KINDS: dict[str, dict[str, _Check]] = {
    "flowkit": {
        "client_id": _STR,
        "connect_timeout": _SECONDS,
        "ssl_cafile": _STR,
        "ssl_certfile": _STR,
        "ssl_keyfile": _STR,
    },
    "client": {
        "request_timeout_ms": _POS,
        "retry_backoff_ms": _NONNEG,
        "metadata_max_age_ms": _NONNEG,
        "security_protocol": _one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
        "sasl_mechanism": _one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        "sasl_plain_username": _STR,
        "sasl_plain_password": _STR,
    },
    "producer": {
        "acks": _one_of(0, 1, -1, "all"),
        "compression_type": _one_of(None, "gzip", "snappy", "lz4", "zstd"),
        "linger_ms": _NONNEG,
        "max_batch_size": _POS,
        "max_request_size": _POS,
    },
    "consumer": {
        "fetch_max_wait_ms": _NONNEG,
        "fetch_min_bytes": _POS,
        "fetch_max_bytes": _POS,
        "max_partition_fetch_bytes": _POS,
        "session_timeout_ms": _POS,
        "heartbeat_interval_ms": _POS,
        "max_poll_interval_ms": _POS,
        "rebalance_timeout_ms": _POS,
        "isolation_level": _one_of("read_uncommitted", "read_committed"),
    },
    "group": {"group_instance_id": _STR},  # static membership (KIP-345), group members only
}
_CHECKS = {name: check for kind in _KINDS.values() for name, check in kind.items()}
_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10.0,
    "acks": "all",
    "linger_ms": 5,
    "max_batch_size": 256 * 1024,
    "fetch_max_wait_ms": 50,
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
}


def _check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    for name, value in settings.items():
        if name not in _CHECKS:
            known = ", ".join(sorted(_CHECKS))
            raise ConfigurationError(f"unknown Kafka setting {name!r} (known: {known})")
        ok, expected = _CHECKS[name]
        if not ok(value):
            raise ConfigurationError(f"Kafka setting {name}={value!r}: expected {expected}")
    s = {**_DEFAULTS, **settings}
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
    return s


# --- errors and connecting ---------------------------------------------------------------


def _translate(exc: BaseException, *, commit: bool = False) -> TransportError:
    what = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, _COMMIT_ERRORS):
        return CommitFailed(f"commit failed, the group rebalanced ({what})")
    if isinstance(exc, _UNAVAILABLE_ERRORS):
        return BrokerUnavailable(f"Kafka broker unavailable ({what})")
    return (CommitFailed if commit else TransportError)(f"Kafka request failed ({what})")


@contextmanager
def map_kafka_errors(*, commit: bool = False) -> Iterator[None]:
    """Translate aiokafka exceptions raised inside the block into ``flowkit.errors``.

    ``BrokerUnavailable`` for connection failures, ``CommitFailed`` for commits refused
    because the group rebalanced (and, with ``commit=True``, for every error),
    ``TransportError`` for the rest. Other exceptions pass through.

    >>> with map_kafka_errors():
    ...     raise kerr.KafkaConnectionError("Connection at 127.0.0.1:9 closed")
    Traceback (most recent call last):
    flowkit.errors.BrokerUnavailable: Kafka broker unavailable (KafkaConnectionError: ...)
    """
    try:
        yield
    except _ALL_ERRORS as exc:
        raise _translate(exc, commit=commit) from exc


async def _connect(
    servers: Sequence[str],
    limit: float,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
) -> None:
    """``start`` an aiokafka client once a broker accepts TCP, retrying for ``limit`` s.

    Probing TCP first keeps aiokafka from logging an error per failed bootstrap.
    """
    loop = asyncio.get_running_loop()
    deadline, backoff, last = loop.time() + limit, 0.05, "timed out"
    try:
        while (remaining := deadline - loop.time()) > 0:
            try:
                async with asyncio.timeout(remaining):
                    for server in servers:
                        host, _, port = server.rpartition(":")
                        try:
                            _, writer = await asyncio.open_connection(host, int(port))
                        except OSError as exc:
                            last = exc.strerror or str(exc)
                            continue
                        writer.close()
                        with map_kafka_errors():
                            await start()
                        return
            except TimeoutError:
                last = "timed out"
            except BrokerUnavailable as exc:
                last = str(exc)
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


# --- transport ---------------------------------------------------------------------------


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
        s = _check_settings(settings)
        opts = {kind: {k: s[k] for k in checks if k in s} for kind, checks in _KINDS.items()}
        own = opts["flowkit"]
        self._connect_timeout = float(own["connect_timeout"])
        self._client_id: str | None = own.get("client_id")
        self._client: dict[str, Any] = {"bootstrap_servers": self.servers, **opts["client"]}
        self._producer, self._consumer = opts["producer"], opts["consumer"]
        self._group = opts["group"]
        if "SSL" in self._client.get("security_protocol", ""):
            files = {k[4:]: v for k, v in own.items() if k.startswith("ssl_")}
            try:
                self._client["ssl_context"] = create_ssl_context(**files)
            except (OSError, ValueError) as exc:
                raise ConfigurationError(f"Kafka ssl_* settings: {exc}") from exc
        self._admin: Any = None
        self._opened: set[KafkaConsumer | KafkaProducer] = set()
        self._closed = False

    def _id(self, client_id: str) -> str:
        # The user's client_id setting names every client (quotas and broker logs key on
        # it); without one, each client keeps the name the worker gave it.
        return self._client_id or client_id

    async def _connect(
        self, start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
    ) -> None:
        await _connect(self.servers, self._connect_timeout, start, stop)

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

    async def _partition_counts(self) -> dict[str, int]:
        if self._closed:
            raise TransportError("the Kafka transport is closed")
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self._client, client_id=self._id("flowkit") + "-admin")
            await self._connect(admin.start, admin.close)
            self._admin = admin
        # Metadata of all topics: asking for a missing one by name creates it on some
        # brokers (Tansu; Kafka with auto.create.topics.enable).
        with map_kafka_errors():
            topics = await self._admin.describe_topics()
        return {t["topic"]: len(t["partitions"]) for t in topics if t["error_code"] == 0}

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create the topics that do not exist yet (``compacted`` sets cleanup.policy).

        Raises ``ConfigurationError`` if one exists with another partition count.
        """
        existing = await self._partition_counts()
        _check_counts(specs, existing)
        missing = {s.name: s for s in specs if s.name not in existing}
        if not missing:
            return
        new = [
            NewTopic(
                s.name,
                s.partitions,
                s.replication_factor,
                topic_configs={
                    **s.config,
                    **({"cleanup.policy": "compact"} if s.compacted else {}),
                },
            )
            for s in missing.values()
        ]
        with map_kafka_errors():
            response = await self._admin.create_topics(new)
        for name, code, *rest in response.topic_errors:
            if code not in (0, kerr.TopicAlreadyExistsError.errno):
                detail = f"{kerr.for_code(code).__name__} {rest[0] if rest else ''}".strip()
                raise TransportError(f"could not create topic {name!r}: {detail}")
        # Another worker may have created one meanwhile, with other partitions.
        _check_counts(missing.values(), await self._partition_counts())

    async def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if it does not exist (never creates it)."""
        return (await self._partition_counts()).get(topic)

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
            await admin.close()


def _check_counts(specs: Iterable[TopicSpec], existing: Mapping[str, int]) -> None:
    problems = [
        f"topic {s.name!r} exists with {existing[s.name]} partitions,"
        f" the app declares {s.partitions}"
        for s in specs
        if existing.get(s.name, s.partitions) != s.partitions
    ]
    if problems:
        raise ConfigurationError("; ".join(dict.fromkeys(problems)))


# --- consumer ----------------------------------------------------------------------------


class _Bridge(ConsumerRebalanceListener):  # type: ignore[misc]
    """Called by aiokafka in its coordinator task; hands each call over to ``getmany``.

    The protocol runs listener callbacks inside ``getmany``, never while the caller is
    still processing a batch; aiokafka would run them concurrently, in its own task.
    """

    def __init__(self, consumer: KafkaConsumer) -> None:
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if revoked:  # aiokafka reports an empty revocation before the first join
            await self._consumer._defer("revoked", revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._consumer._defer("assigned", assigned)


class KafkaConsumer:
    """An ``AIOKafkaConsumer`` behind the ``Consumer`` protocol (auto-commit off).

    The aiokafka client is made in ``start`` (it needs the running loop), or by the first
    ``getmany``/``commit``/``committed``; ``subscribe``, ``assign``, ``seek``, ``pause`` and
    ``resume`` called before that are replayed then. Closing leaves the group without a
    revocation callback: commit before ``aclose``.
    """

    def __init__(self, transport: KafkaTransport, options: dict[str, Any]) -> None:
        self._transport = transport
        self._options = options
        self._group_id: str | None = options["group_id"]
        self._kafka: Any = None
        self._replay: list[Callable[[], None]] = []
        self._listener: RebalanceListener | None = None
        self._owned: set[TopicPartition] = set()
        # Rebalance callbacks waiting for getmany: (kind, partitions, done).
        self._deferred: list[tuple[str, set[TopicPartition], asyncio.Future[None]]] = []
        self._wakeup: asyncio.Future[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Connect, retrying until ``connect_timeout``; a group member joins in ``getmany``."""
        if self._kafka is None:
            if self._closed:
                raise TransportError("this Kafka consumer is closed")
            kafka = aiokafka.AIOKafkaConsumer(**self._options)
            await self._transport._connect(kafka.start, kafka.stop)
            self._kafka = kafka
            replay, self._replay = self._replay, []
            for call in replay:
                call()

    async def _started(self) -> Any:
        await self.start()
        return self._kafka

    def _later(self, call: Callable[[], None]) -> bool:
        if self._kafka is None:
            self._replay.append(call)
        return self._kafka is None

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the consumer group for ``topics``; the group assigns partitions."""
        if self._group_id is None:
            raise ConfigurationError("subscribe() needs a group_id; use assign() without one")
        self._listener, self._owned = listener, set()
        if not self._later(lambda: self.subscribe(topics, listener)):
            with map_kafka_errors():
                self._kafka.subscribe(topics=list(topics), listener=_Bridge(self))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions; those kept from the last call keep their position."""
        if self._listener is not None:
            raise ConfigurationError("assign() on a consumer that subscribed to a group")
        self._owned = wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}
        if self._later(lambda: self.assign(wanted)):
            return
        # aiokafka restarts every partition of a new assignment; Kafka's keeps the old ones.
        kept = [(tp, self._state(tp)) for tp in wanted]
        kept = [(_KTP(*tp), state) for tp, state in kept if state is not None]
        with map_kafka_errors():
            self._kafka.assign([_KTP(*tp) for tp in wanted])
            for tp, state in kept:
                if state.has_valid_position:
                    self._kafka.seek(tp, state.position)
                if state.paused:
                    self._kafka.pause(tp)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now (as last told to the listener)."""
        return set(self._owned)

    def _state(self, tp: TopicPartition) -> Any:
        # aiokafka's state of tp in the current assignment: position, highwater, paused.
        subscription = self._kafka._subscription.subscription if self._kafka else None
        assignment = subscription.assignment if subscription is not None else None
        return assignment.state_value(tp) if assignment is not None else None

    async def _defer(self, kind: str, partitions: Any) -> None:
        if not self._closed:
            done = asyncio.get_running_loop().create_future()
            self._deferred.append((kind, {TopicPartition(*tp) for tp in partitions}, done))
            if self._wakeup is not None and not self._wakeup.done():
                self._wakeup.set_result(None)
            await done

    async def _run_deferred(self) -> None:
        while self._deferred:
            kind, partitions, done = self._deferred.pop(0)
            try:
                if kind == "revoked":
                    self._owned -= partitions
                    if self._listener is not None:
                        await self._listener.on_partitions_revoked(partitions)
                else:
                    self._owned = set(partitions)
                    if self._listener is not None:
                        await self._listener.on_partitions_assigned(partitions)
            finally:
                if not done.done():
                    done.set_result(None)

    async def getmany(
        self, timeout: float, max_records: int
    ) -> dict[TopicPartition, list[Message]]:
        """Up to ``max_records`` records; runs due rebalance callbacks first."""
        kafka = self._kafka or await self._started()
        subscription = kafka._subscription
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._deferred:
                await self._run_deferred()
            if self._closed:  # by another task meanwhile
                return {}
            if not subscription.reassignment_in_progress:
                # Fast path: records the background fetcher already has; nothing waits.
                try:
                    raw = await kafka.getmany(timeout_ms=0, max_records=max_records)
                except _ALL_ERRORS as exc:
                    raise _translate(exc) from exc
                if raw:
                    return _convert(raw)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
            raw = await self._wait(kafka, remaining, max_records)
            if raw:
                # Records of newly assigned partitions only after on_partitions_assigned.
                if self._deferred and self._deferred[0][0] == "assigned":
                    await self._run_deferred()
                return _convert(raw)

    async def _wait(self, kafka: Any, limit: float, max_records: int) -> Any:
        # aiokafka's getmany may block on a rebalance that waits for our listener, which
        # only getmany runs: wait for records, a deferred callback or the deadline.
        loop = asyncio.get_running_loop()
        fetch = loop.create_task(
            kafka.getmany(timeout_ms=int(limit * 1000), max_records=max_records)
        )
        self._wakeup = wakeup = loop.create_future()
        try:
            await asyncio.wait((fetch, wakeup), timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._wakeup = None
            if not fetch.done():
                # Safe: aiokafka hands records over only in the step that returns them.
                fetch.cancel()
                try:
                    await fetch
                except asyncio.CancelledError:
                    pass
        if fetch.cancelled():
            return None
        if (exc := fetch.exception()) is not None:
            raise (_translate(exc) if isinstance(exc, _ALL_ERRORS) else exc) from exc
        return fetch.result()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` on the next ``getmany``."""
        if not self._later(lambda: self.seek(tp, offset)):
            with map_kafka_errors():
                self._kafka.seek(_KTP(tp[0], tp[1]), offset)

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``getmany`` returns for ``tp``.

        Read from aiokafka's partition state, which its fetcher advances as records are
        handed out and ``seek`` sets (aiokafka's own ``position()`` is a coroutine). Right
        after an assignment it is unknown until the background fetcher has looked up the
        committed offset or applied the reset policy: ``TransportError`` then.
        """
        state = self._state(tp)
        if state is None:
            raise TransportError(f"{tp.topic}[{tp.partition}] is not assigned to this consumer")
        if not state.has_valid_position:
            raise TransportError(f"the position of {tp.topic}[{tp.partition}] is not known yet")
        return int(state.position)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The log end offset of ``tp`` from the last fetch response, or None."""
        state = self._state(tp)
        return None if state is None else state.highwater

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Return no records for these partitions (those assigned) until ``resume``."""
        tps = list(partitions)
        if not self._later(lambda: self.pause(tps)):
            self._kafka.pause(*(_KTP(*tp) for tp in tps if self._state(tp) is not None))

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """Return records for these partitions again."""
        tps = list(partitions)
        if not self._later(lambda: self.resume(tps)):
            self._kafka.resume(*(_KTP(*tp) for tp in tps if self._state(tp) is not None))

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit, for each partition, the offset of the next record to read."""
        if self._group_id is None or self._closed:
            why = "is closed" if self._closed else "has no group_id"
            raise CommitFailed(f"cannot commit: this consumer {why}")
        kafka = self._kafka or await self._started()
        if offsets:
            with map_kafka_errors(commit=True):
                await kafka.commit({_KTP(tp[0], tp[1]): off for tp, off in offsets.items()})

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for ``tp``, or None."""
        if self._group_id is None:
            raise ConfigurationError("committed() needs a consumer with a group_id")
        kafka = self._kafka or await self._started()
        with map_kafka_errors():
            offset = await kafka.committed(_KTP(tp[0], tp[1]))
        return None if offset is None else int(offset)

    async def aclose(self) -> None:
        """Leave the group and disconnect; rebalance callbacks still due are dropped."""
        if self._closed:
            return
        self._closed = True
        self._transport._opened.discard(self)
        for _, _, done in self._deferred:
            if not done.done():
                done.set_result(None)  # aiokafka's stop() waits for its coordinator task
        self._deferred.clear()
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)  # a getmany waiting in another task returns {}
        kafka, self._kafka = self._kafka, None
        if kafka is not None:
            with map_kafka_errors():
                await kafka.stop()


def _convert(raw: Mapping[Any, Any]) -> dict[TopicPartition, list[Message]]:
    # The hot path: one Message per ConsumerRecord, positional arguments, nothing else.
    out: dict[TopicPartition, list[Message]] = {}
    for (topic, partition), records in raw.items():
        out[TopicPartition(topic, partition)] = [
            Message(topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in records
        ]
    return out


# --- producer ----------------------------------------------------------------------------


class _PendingAck:
    """Awaitable ``Ack`` over aiokafka's delivery future, with its errors translated."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self._future = future

    def __await__(self) -> Generator[Any, None, Ack]:
        try:
            meta = yield from self._future.__await__()
        except _ALL_ERRORS as exc:
            raise _translate(exc) from exc
        return Ack(meta.topic, meta.partition, meta.offset)

    def done(self) -> bool:
        """True once the broker answered (ack or error)."""
        return self._future.done()

    def result(self) -> Ack:
        """The ``Ack`` of a ``done()`` send; raises its translated error."""
        try:
            meta = self._future.result()
        except _ALL_ERRORS as exc:
            raise _translate(exc) from exc
        return Ack(meta.topic, meta.partition, meta.offset)


class KafkaProducer:
    """An ``AIOKafkaProducer`` behind the ``Producer`` protocol; started by ``start`` or
    the first ``send``."""

    def __init__(self, transport: KafkaTransport, options: dict[str, Any]) -> None:
        self._transport = transport
        self._options = options
        self._kafka: Any = None
        self._closed = False

    async def start(self) -> None:
        """Connect, retrying until ``connect_timeout``."""
        if self._kafka is None:
            if self._closed:
                raise TransportError("this Kafka producer is closed")
            kafka = aiokafka.AIOKafkaProducer(**self._options)
            await self._transport._connect(kafka.start, kafka.stop)
            self._kafka = kafka

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Ack]:
        """Queue one record; a keyed one goes where murmur2 of its key says."""
        if self._kafka is None:
            await self.start()
        try:
            future = await self._kafka.send(
                topic,
                value,
                key=key,
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=list(headers) if headers else None,
            )
        except _ALL_ERRORS as exc:
            raise _translate(exc) from exc
        return _PendingAck(future)

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged (or failed)."""
        if self._kafka is not None:
            # Closes the open batches and wakes the sender, so a flush does not wait out
            # linger_ms as aiokafka's flush() does.
            with map_kafka_errors():
                await self._kafka._message_accumulator.flush_for_commit()

    async def aclose(self) -> None:
        """Flush and disconnect. Idempotent."""
        if not self._closed:
            self._closed = True
            self._transport._opened.discard(self)
            kafka, self._kafka = self._kafka, None
            if kafka is not None:
                with map_kafka_errors():
                    await kafka.stop()
