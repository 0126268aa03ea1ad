"""The transport protocol: what the worker needs from a broker, and nothing more.

Two implementations: ``MemoryTransport`` (embedded, the default) and ``KafkaTransport``
(aiokafka). The protocol follows Kafka's consumer and producer so the Kafka adapter is a
thin mapping; nothing outside ``flowkit.transports`` knows which one runs.

Offsets follow Kafka: a committed offset is the offset of the *next* record to read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..records import Headers, Message, TopicPartition

__all__ = [
    "Ack",
    "Consumer",
    "OffsetReset",
    "OutRecord",
    "Producer",
    "RebalanceListener",
    "TimestampBounds",
    "TopicSpec",
    "TransactionalProducer",
    "Transport",
]

OffsetReset = Literal["earliest", "latest"]

OutRecord = tuple[bytes | None, bytes | None, Headers, int | None]
"""A record to send in a batch: (key, value, headers, timestamp_ms or None for now)."""

TimestampBounds = tuple[int | None, int | None]
"""How far ahead of and behind now a topic takes a record's timestamp, in ms (None: no
bound)."""


@dataclass(frozen=True)
class TopicSpec:
    """A topic the app needs: name, partitions and configuration.

    ``internal``: a topic flowkit makes for itself (changelog, repartition, dead letters),
    into which it carries the timestamps of the records it read. It takes any timestamp,
    so that a record its input took (stamped far ahead, say) is never refused there.
    """

    name: str
    partitions: int
    replication_factor: int = 1
    compacted: bool = False
    config: Mapping[str, str] = field(default_factory=dict)
    internal: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    """Where the broker stored a sent record."""

    topic: str
    partition: int
    offset: int


class RebalanceListener(Protocol):
    """Told when the group moves partitions. Revocation comes before the new assignment.

    Both callbacks run inside ``Consumer.getmany``; while ``on_partitions_revoked`` runs,
    the partitions are still owned, so it may flush and commit.
    """

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


class Consumer(Protocol):
    """Reads batches from assigned partitions and commits offsets for a group.

    Only what flowkit's runtime calls: implementations may offer more (``KafkaConsumer``
    has ``committed``), but nothing outside ``flowkit.transports`` may rely on it.
    """

    async def start(self) -> None:
        """Connect. For a group member, joining happens in the first ``getmany``."""

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the consumer group for ``topics``; the group assigns partitions."""

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions, outside any group (table recovery, global tables)."""

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now."""

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` (assigned with ``assign``) from ``offset`` on. An offset outside
        the log is reset as ``auto_offset_reset`` says, at the next fetch."""

    async def getmany(
        self, timeout: float, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Message]]:
        """Up to ``max_records`` records, in offset order per partition: a list, or the
        client's own records made ``Message``s as they are read (``RawMessages``).

        Waits at most ``timeout`` seconds when nothing is available; returns ``{}`` then.
        """

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``getmany`` returns for ``tp``."""

    def highwater(self, tp: TopicPartition) -> int | None:
        """The log end offset of ``tp`` as last seen in a fetch (None before any fetch)."""

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit, for each partition, the offset of the next record to read."""

    async def aclose(self) -> None:
        """Leave the group and disconnect. Idempotent."""


class Producer(Protocol):
    """Sends records. ``send`` returns once the record is queued; await its result for the ack."""

    max_record_bytes: int | None
    """The largest record (key, value and headers) ``send`` surely takes, or None for no
    limit. (A Kafka producer counts its framing too, so it takes a little more.)"""

    async def start(self) -> None:
        """Connect."""

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
        """Queue one record; the returned awaitable resolves to its ``Ack``.

        The awaitable is either an ``Ack`` (already stored) or has ``done()`` and
        ``result()`` like a future, so the worker can check sends without awaiting them.

        With no ``partition``, a keyed record goes where Kafka's default partitioner puts
        it (murmur2 of the key) and a keyless one is spread over the partitions.

        A record over ``max_record_bytes`` raises ``RecordRejected`` here; one the broker
        refuses for good (its own size limit, authorisation) fails its ack with it.
        """

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        """Queue ``records`` for one partition, in order, as few broker batches as fit.

        Returns, per broker batch, how many of the records it holds (in order) and the
        awaitable ``Ack`` of its last record; a refusal fails a whole broker batch. The
        caller has checked each record against ``max_record_bytes``.
        """

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged (or failed)."""

    async def aclose(self) -> None:
        """Flush and disconnect. Idempotent."""


class TransactionalProducer(Producer, Protocol):
    """A ``Producer`` whose sends are transactions (exactly-once processing).

    The first send after a commit or an abort opens a transaction; every send until the
    next ``commit_transaction`` belongs to it. Readers with ``read_committed`` see its
    records only once it is committed, and never if it is aborted.
    """

    async def commit_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        consumer: Consumer,
        *,
        fence: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Commit the open transaction with ``offsets`` as the committed offsets of
        ``consumer``'s group, atomically: both count, or neither.

        The commit is checked against ``consumer``'s group generation: a worker whose
        partitions the group gave to another member (a zombie) is fenced. The broker checks
        the generation of offsets only, so a transaction of outputs alone (windows closed
        by time) carries ``fence`` instead, offsets already committed, sent again: a
        zombie's outputs are refused even when it read nothing new. On any failure
        the transaction is aborted and ``TransactionAborted`` raised (``fenced=True`` for a
        zombie); the producer is usable again afterwards, unless fenced.
        """

    async def abort_transaction(self) -> None:
        """Abort the open transaction, if any: none of its records or offsets count."""


class Transport(Protocol):
    """A broker connection factory: consumers, producers, and topic administration."""

    url: str

    def consumer(
        self,
        *,
        group_id: str | None,
        client_id: str = "flowkit",
        auto_offset_reset: OffsetReset = "earliest",
    ) -> Consumer:
        """A new consumer; ``group_id=None`` reads only what is ``assign``ed."""

    def producer(self, *, client_id: str = "flowkit") -> Producer:
        """A new producer."""

    def transactional_producer(
        self, *, transactional_id: str, client_id: str = "flowkit"
    ) -> TransactionalProducer:
        """A new producer that sends in transactions, named ``transactional_id`` (a new
        producer of the same id fences the older one). From this call on, every consumer
        this transport makes reads ``read_committed``: records of aborted transactions are
        never read, in a worker's input, changelogs or repartition topics.

        Raises ``ConfigurationError`` where the broker has no transactions.
        """

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create the topics that do not exist yet.

        Raises ``ConfigurationError`` if one exists with another partition count.
        """

    async def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if it does not exist."""

    async def timestamp_bounds(self, topic: str) -> TimestampBounds:
        """How far ahead of and behind now ``topic`` takes a record's timestamp, from its
        configuration ((None, None) if it bounds nothing, or cannot be read)."""

    async def watch(self) -> None:
        """Watch the broker while a worker runs: return if there is nothing to watch,
        raise ``BrokerUnavailable`` if it stays unreachable longer than allowed."""

    async def aclose(self) -> None:
        """Release everything. Idempotent."""
