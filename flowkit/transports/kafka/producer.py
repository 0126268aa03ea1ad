"""``KafkaProducer`` and ``KafkaTransactionalProducer``: aiokafka's producer behind the
``Producer`` and ``TransactionalProducer`` protocols. ``KafkaTransport`` makes them; they
connect through it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiokafka
import aiokafka.errors as kerr

from ...errors import CommitFailed, ConfigurationError, TransactionAborted, TransportError
from ...records import Headers, TopicPartition
from ..base import Ack, OutRecord
from .consumer import KafkaConsumer
from .errors import KAFKA_ERRORS, map_kafka_errors, translate

try:
    from . import generations
except ImportError:  # an aiokafka without the protocol classes it builds requests from
    generations = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .transport import KafkaTransport

__all__ = ["KAFKA_FRAMING", "KafkaProducer", "KafkaTransactionalProducer"]

_KTP = aiokafka.TopicPartition


class _PendingAck:
    """Awaitable ``Ack`` over aiokafka's delivery future, with its errors translated
    (``last`` records after the one the broker reports: a batch's last record)."""

    __slots__ = ("_future", "_last")

    def __init__(self, future: asyncio.Future[Any], last: int = 0) -> None:
        self._future = future
        self._last = last

    def __await__(self) -> Generator[Any, None, Ack]:
        try:
            # Shielded: a waiter cancelled (an agent, a checkpoint, at a stop) must not
            # cancel the delivery future, which the publisher reads again afterwards.
            meta = yield from asyncio.shield(self._future).__await__()
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc
        return Ack(meta.topic, meta.partition, meta.offset + self._last)

    def done(self) -> bool:
        """True once the broker answered (ack or error)."""
        return self._future.done()

    def result(self) -> Ack:
        """The ``Ack`` of a ``done()`` send; raises its translated error."""
        try:
            meta = self._future.result()
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc
        return Ack(meta.topic, meta.partition, meta.offset + self._last)


# Bytes of a record batch that are not key, value or headers (batch header, varints): what
# aiokafka adds before it compares a record with max_request_size.
KAFKA_FRAMING = 1024


class KafkaProducer:
    """An ``AIOKafkaProducer`` behind the ``Producer`` protocol; started by ``start`` or
    the first ``send``."""

    def __init__(self, transport: KafkaTransport, options: dict[str, Any]) -> None:
        self._transport = transport
        self._options = options
        self.max_record_bytes: int | None = options["max_request_size"] - KAFKA_FRAMING
        self._kafka: Any = None
        self._closed = False

    async def start(self) -> None:
        """Connect, retrying until ``connect_timeout``."""
        if self._kafka is None:
            if self._closed:
                raise TransportError("this Kafka producer is closed")
            kafka = aiokafka.AIOKafkaProducer(**self._options)
            await self._transport.connect(kafka.start, kafka.stop)
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
        if key is None and value is None:
            return await self._send_null(topic, partition, timestamp_ms, headers)
        try:
            future = await self._kafka.send(
                topic,
                value,
                key=key,
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=list(headers) if headers else None,
            )
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc
        return _PendingAck(future)

    async def _send_null(
        self, topic: str, partition: int | None, timestamp_ms: int | None, headers: Headers
    ) -> Awaitable[Ack]:
        # A record with neither key nor value is valid Kafka (a keyless tombstone, which
        # a dead letter may carry), but aiokafka's send() refuses one: a batch of its own.
        if partition is None:
            with map_kafka_errors():
                partitions = sorted(await self._kafka.partitions_for(topic))
            partition = partitions[random.randrange(len(partitions))]
        ((_, ack),) = await self.send_batch(topic, partition, [(None, None, headers, timestamp_ms)])
        return ack

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        """Queue the records for ``partition`` in aiokafka batches of up to
        ``max_batch_size`` bytes: no partitioner and no per-record future."""
        kafka = self._kafka
        if kafka is None:
            await self.start()
            kafka = self._kafka
        out: list[tuple[int, Awaitable[Ack]]] = []
        try:
            batch, count = kafka.create_batch(), 0
            for key, value, headers, timestamp_ms in records:
                listed = list(headers) if headers else None  # aiokafka's C builder: a list
                if batch.append(key=key, value=value, timestamp=timestamp_ms, headers=listed):
                    count += 1
                    continue
                future = await kafka.send_batch(batch, topic, partition=partition)
                out.append((count, _PendingAck(future, count - 1)))
                batch, count = kafka.create_batch(), 1
                batch.append(key=key, value=value, timestamp=timestamp_ms, headers=listed)
            if count:
                future = await kafka.send_batch(batch, topic, partition=partition)
                out.append((count, _PendingAck(future, count - 1)))
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc
        return out

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged (or failed)."""
        if self._kafka is not None:
            # Closes the open batches and wakes the sender, so a flush does not wait out
            # linger_ms as aiokafka's flush() does.
            with map_kafka_errors():
                await self._kafka._message_accumulator.flush_for_commit()  # noqa: SLF001 (aiokafka's)

    async def aclose(self) -> None:
        """Flush and disconnect. Idempotent."""
        if not self._closed:
            self._closed = True
            self._transport.forget(self)
            kafka, self._kafka = self._kafka, None
            if kafka is not None:
                await self._transport.disconnect(kafka)


class KafkaTransactionalProducer(KafkaProducer):
    """A ``KafkaProducer`` whose sends are transactions (``TransactionalProducer``): the
    first send after a commit or an abort begins one."""

    def __init__(self, transport: KafkaTransport, options: dict[str, Any]) -> None:
        super().__init__(transport, options)
        self._open = False  # a transaction is open: begun by a send, not yet ended
        self._ending = False  # commit_transaction is under way: sends wait for the next
        self._lock = asyncio.Lock()  # one begin or commit at a time
        self._fenced = False

    async def _begin(self) -> None:
        # Sends from several tasks: one begins the transaction, the others wait for it;
        # a send during a commit waits for it and goes into the next transaction.
        async with self._lock:
            if not self._open:
                await self._begin_now()

    async def _begin_now(self) -> None:
        if self._fenced:
            raise TransactionAborted("this producer was fenced by a newer one", fenced=True)
        if self._kafka is None:
            await self.start()
        try:
            await self._kafka.begin_transaction()
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc
        self._open = True

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
        """Queue one record in the open transaction (begun here if none is)."""
        if not self._open or self._ending:
            await self._begin()
        return await super().send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        """Queue records for ``partition`` in the open transaction (begun if none is)."""
        if not self._open or self._ending:
            await self._begin()
        return await super().send_batch(topic, partition, records)

    async def commit_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        consumer: Any,
        *,
        fence: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Commit the open transaction with ``offsets`` for ``consumer``'s group (a
        ``KafkaConsumer``), after checking that the group still counts the consumer in its
        generation; on any failure abort it and raise ``TransactionAborted``."""
        if not isinstance(consumer, KafkaConsumer) or consumer.group_id is None:
            raise ConfigurationError("commit_transaction needs a KafkaConsumer of a group")
        async with self._lock:
            self._ending = True
            try:
                if not offsets and fence and self._open:
                    offsets = fence  # outputs alone: the generation is checked all the same
                await self._commit(offsets, consumer)
            finally:
                self._ending = False

    async def _commit(self, offsets: Mapping[TopicPartition, int], consumer: KafkaConsumer) -> None:
        try:
            if offsets and not self._open:
                await self._begin_now()
            if not self._open:
                return  # nothing sent and nothing read: nothing to commit
            kafka = self._kafka
            if offsets:
                commits = {_KTP(tp[0], tp[1]): off for tp, off in offsets.items()}
                await self._send_offsets(kafka, commits, consumer)
            await kafka.commit_transaction()
            self._open = False
        except (*KAFKA_ERRORS, TransportError) as exc:
            fenced = isinstance(exc, CommitFailed | kerr.ProducerFenced | TransactionAborted)
            fenced = fenced or getattr(exc, "fenced", False)
            await self._aborted(exc, fenced=fenced)

    async def _send_offsets(
        self, kafka: Any, offsets: dict[Any, int], consumer: KafkaConsumer
    ) -> None:
        group = consumer.group_id
        assert group is not None and consumer.client is not None
        if generations is not None and aiokafka.__version__.startswith(
            generations.CHECKED_RELEASES
        ):
            # With the generation they were read in: the group coordinator refuses a zombie's.
            if consumer.generation is None:
                raise CommitFailed("offsets of partitions this worker was never assigned")
            await generations.send_offsets(kafka, consumer.generation, offsets, group)
            return
        # Another aiokafka release: its own TxnOffsetCommit, which has no generation, and
        # then the heartbeat's answer on it (a zombie paused in between still commits).
        await kafka.send_offsets_to_transaction(offsets, group)
        await consumer.check_generation()

    async def _aborted(self, exc: BaseException, *, fenced: bool) -> None:
        if isinstance(exc, kerr.ProducerFenced):
            self._fenced = True  # for good: a newer producer has this transactional id
        else:
            await self.abort_transaction()
        what = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise TransactionAborted(f"transaction aborted ({what})", fenced=fenced) from exc

    async def abort_transaction(self) -> None:
        """Abort the open transaction, if any (a fenced producer has none left to abort)."""
        if not self._open or self._fenced or self._kafka is None:
            self._open = False
            return
        self._open = False
        try:
            await self._kafka.abort_transaction()
        except kerr.ProducerFenced:
            self._fenced = True
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc
