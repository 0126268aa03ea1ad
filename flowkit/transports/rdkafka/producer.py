"""``RdkafkaProducer``: a librdkafka producer behind the ``Producer`` protocol.

``produce`` only queues (it never blocks); acknowledgements come back through delivery
callbacks, which librdkafka runs inside ``poll`` (and ``flush``). A thread of the producer's
own is the only one that polls or flushes, so the callbacks of a batch never run in two
threads at once and count without a lock; it collects the finished batches and hands each
collection to the event loop in one call, where the send futures are resolved: one loop
wake-up per batch of acks, not per record.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import confluent_kafka as ck
import structlog

from ...errors import TransactionAborted, TransportError
from ...records import Headers, TopicPartition
from ..base import Ack, OutRecord
from .errors import RDKAFKA_ERRORS, map_rdkafka_errors, translate

if TYPE_CHECKING:
    from .transport import RdkafkaTransport

log = structlog.get_logger(__name__)

__all__ = ["RdkafkaProducer", "RdkafkaTransactionalProducer"]

_Delivery = tuple["asyncio.Future[Ack]", Any, Any]
_POLL = 0.02  # seconds the poller waits for acks before it looks for a flush or aclose()


def _resolve(done: list[_Delivery], flushed: list[asyncio.Future[None]]) -> None:
    # On the event loop: one call for every acknowledgement collected by one poll.
    for future, error, record in done:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(translate(ck.KafkaException(error)))
        else:
            future.set_result(Ack(record.topic(), record.partition(), record.offset()))
    for waiter in flushed:
        if not waiter.done():
            waiter.set_result(None)


FRAMING = 1024  # bytes of record and batch framing kept free under message.max.bytes


class RdkafkaProducer:
    """A ``confluent_kafka.Producer`` behind the ``Producer`` protocol; started by ``start``
    or the first ``send``. Keyed records go where murmur2 of the key says (librdkafka's
    ``murmur2_random`` partitioner, the Java client's)."""

    def __init__(self, transport: RdkafkaTransport, config: dict[str, Any]) -> None:
        self._transport = transport
        self._config = config
        # librdkafka counts a record's framing in message.max.bytes, as Kafka does.
        self.max_record_bytes: int | None = int(config["message.max.bytes"]) - FRAMING
        self._kafka: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Finished batches, appended by delivery callbacks: only in the poller thread
        # (and in the loop's thread once the poller has stopped).
        self._done: list[_Delivery] = []
        # flush() calls waiting for an empty queue: the loop adds, the poller takes.
        self._flushes: list[asyncio.Future[None]] = []
        self._lock = threading.Lock()  # guards _flushes
        self._poller: threading.Thread | None = None
        self._stopping = threading.Event()
        self._fatal: TransportError | None = None
        self._closed = False

    async def start(self) -> None:
        """Connect (``BrokerUnavailable`` after ``connect_timeout``)."""
        if self._kafka is not None:
            return
        if self._closed:
            raise TransportError("this Kafka producer is closed")
        self._loop = asyncio.get_running_loop()
        kafka = ck.Producer({**self._config, "error_cb": self._on_error})
        await self._transport.connect(kafka)
        self._kafka = kafka
        self._poller = threading.Thread(
            target=self._poll, args=(kafka,), name="flowkit-rdkafka-producer", daemon=True
        )
        self._poller.start()

    def _on_error(self, error: Any) -> None:
        if error.fatal():
            self._fatal = translate(ck.KafkaException(error))
        else:
            self._transport.on_error(error)  # a lost connection: the broker watch checks

    def _poll(self, kafka: Any) -> None:
        # The only thread that serves delivery callbacks while the producer runs.
        try:
            while not self._stopping.is_set():
                if self._flushes:
                    kafka.flush(_POLL)  # sends at once rather than waiting out linger_ms
                else:
                    kafka.poll(_POLL)
                self._hand_over(kafka, stopped=False)
        except RDKAFKA_ERRORS as exc:  # only if librdkafka itself fails
            self._fatal = translate(exc)
        finally:
            self._hand_over(kafka, stopped=True)  # no flush() waits for ever

    def _hand_over(self, kafka: Any, stopped: bool) -> None:
        done: list[_Delivery] = []
        flushed: list[asyncio.Future[None]] = []
        if self._done:
            done, self._done = self._done, []
        # An empty queue (its length counts acks not yet served too): every ack is done.
        if self._flushes and (stopped or len(kafka) == 0):
            with self._lock:
                flushed, self._flushes = self._flushes, []
        if done or flushed:
            assert self._loop is not None
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(_resolve, done, flushed)

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
        """Queue one record; the future resolves to its ``Ack``."""
        record = (key, value, headers, timestamp_ms)
        return await self._produce(topic, -1 if partition is None else partition, (record,))

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        """Queue ``records`` for ``partition`` (librdkafka batches them itself); one
        awaitable for all of them: the ``Ack`` of the last, or the first failure."""
        if not records:
            return []
        return [(len(records), await self._produce(topic, partition, records))]

    async def _produce(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> asyncio.Future[Ack]:
        # One future and one delivery counter per call, not a future, a callback object and
        # a hand-over per record: a router's outputs come by the thousand. Partition -1:
        # librdkafka's partitioner places each record.
        if self._kafka is None:
            await self.start()
        if self._fatal is not None:
            raise self._fatal
        assert self._loop is not None
        future: asyncio.Future[Ack] = self._loop.create_future()
        delivered = self._batch_delivery(future, len(records))
        produce = self._kafka.produce
        start, end = 0, len(records)
        while True:
            try:
                start = _queue(produce, topic, partition, records, start, delivered)
            except RDKAFKA_ERRORS as exc:
                raise translate(exc) from exc
            if start == end:
                return future
            # librdkafka's local queue is full: the poller drains it as acks arrive.
            await asyncio.sleep(0.005)

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged (or failed), and its
        future resolved.

        librdkafka sends at once on a flush rather than waiting out ``linger_ms``.
        """
        kafka, poller = self._kafka, self._poller
        if kafka is None or poller is None:
            return
        waiter = asyncio.get_running_loop().create_future()
        with self._lock:
            self._flushes.append(waiter)
        if not poller.is_alive():  # it stopped: nothing else serves the callbacks now
            self._flushes.clear()
            with map_rdkafka_errors():
                await asyncio.get_running_loop().run_in_executor(None, self._drain, kafka)
            return
        await waiter
        if self._fatal is not None:
            raise self._fatal

    def _drain(self, kafka: Any) -> None:
        while kafka.flush(0.5) > 0:
            pass
        done, self._done = self._done, []
        assert self._loop is not None
        self._loop.call_soon_threadsafe(_resolve, done, [])

    async def aclose(self) -> None:
        """Flush and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._transport.forget(self)
        if self._kafka is None:
            return
        limit = self._transport.closing_limit()
        try:
            async with asyncio.timeout(limit):
                await self.flush()
        except TimeoutError:  # the broker is away: its acks will not come in time
            log.warning("a Kafka client did not close while the broker is away", limit=limit)
        finally:
            self._stopping.set()
            poller = self._poller
            if poller is not None:
                await asyncio.get_running_loop().run_in_executor(None, poller.join)
            if self._done:
                _resolve(self._done, [])
                self._done = []
            self._kafka = None

    def _batch_delivery(self, future: asyncio.Future[Ack], n: int) -> Callable[[Any, Any], None]:
        """The delivery callback of every record of one ``send`` or ``send_batch``: it counts
        their reports, and the last one hands the result (the first error, else the last
        record, which librdkafka reports last within a partition) to the event loop with the
        producer's other acks. A closure and no lock: every report comes from the poller
        thread, and a bound method taking a lock cost 0.7-1.5 us more a record
        (benchmarks/rdkafka_produce.py)."""
        remaining = n
        failure: Any = None

        def delivered(error: Any, record: Any) -> None:
            nonlocal remaining, failure
            remaining -= 1
            if error is not None and failure is None:
                failure = error
            if not remaining:
                self._done.append((future, failure, record))

        return delivered


class RdkafkaTransactionalProducer(RdkafkaProducer):
    """A ``RdkafkaProducer`` whose sends are transactions (``TransactionalProducer``): the
    first send after a commit or an abort begins one. Offsets go to the transaction with
    the consumer's group metadata (KIP-447): the group coordinator refuses them from a
    member of an older generation, which fences a zombie."""

    def __init__(self, transport: RdkafkaTransport, config: dict[str, Any]) -> None:
        super().__init__(transport, config)
        self._open = False  # a transaction is open: begun by a send, not yet ended
        self._ending = False  # commit_transaction is under way: sends wait for the next
        self._txn_lock = asyncio.Lock()  # one begin or commit at a time
        self._limit = float(transport.connect_timeout)  # seconds a transaction call may block

    async def start(self) -> None:
        """Connect, then register the transactional id (fencing an older producer of it,
        and aborting what that one left open)."""
        if self._kafka is not None:
            return
        await super().start()
        kafka: Any = self._kafka
        with map_rdkafka_errors():
            await self._blocking(lambda: kafka.init_transactions(self._limit))

    async def _blocking(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def _produce(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> asyncio.Future[Ack]:
        if not self._open or self._ending:
            # One send begins the transaction; one during a commit waits for the next.
            async with self._txn_lock:
                if self._kafka is None:
                    await self.start()
                if not self._open:
                    self._begin_now()
        return await super()._produce(topic, partition, records)

    def _begin_now(self) -> None:
        with map_rdkafka_errors():
            self._kafka.begin_transaction()
        self._open = True

    async def commit_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        consumer: Any,
        *,
        fence: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Commit the open transaction with ``offsets`` for ``consumer``'s group (an
        ``RdkafkaConsumer``: its group metadata goes with them); on any failure abort it
        and raise ``TransactionAborted``."""
        async with self._txn_lock:
            self._ending = True
            try:
                if not offsets and fence and self._open:
                    offsets = fence  # outputs alone: the generation is checked all the same
                await self._commit(offsets, consumer)
            finally:
                self._ending = False

    async def _commit(self, offsets: Mapping[TopicPartition, int], consumer: Any) -> None:
        if self._kafka is None:
            await self.start()
        kafka = self._kafka
        if consumer.lost_partitions():
            # The group went on without this worker (it missed its session): another
            # member may have processed these records, and its tables may hold changes
            # of them. The broker would refuse the offsets of the old generation, but not
            # a transaction of outputs alone (windows closed by time): none of it counts,
            # and the worker starts again from its last commit, as when fenced.
            await self.abort_transaction()
            raise TransactionAborted(
                "transaction aborted (this worker's partitions were lost to another member "
                "of the group)",
                fenced=True,
            )
        try:
            if offsets and not self._open:
                self._begin_now()
            if not self._open:
                return  # nothing sent and nothing read: nothing to commit
            if offsets:
                metadata = consumer.group_metadata()  # of the generation that read them
                listed = [ck.TopicPartition(tp[0], tp[1], off) for tp, off in offsets.items()]
                await self._blocking(
                    lambda: kafka.send_offsets_to_transaction(listed, metadata, self._limit)
                )
            await self._blocking(lambda: kafka.commit_transaction(self._limit))
            self._open = False
        except RDKAFKA_ERRORS as exc:
            error = exc.args[0] if exc.args else None
            fenced = error is not None and (
                error.fatal() or error.code() in _FENCED_CODES or error.code() in _ZOMBIE_CODES
            )
            if error is None or not error.fatal():
                await self.abort_transaction()
            what = translate(exc)
            raise TransactionAborted(f"transaction aborted ({what})", fenced=fenced) from exc

    async def abort_transaction(self) -> None:
        """Abort the open transaction, if any."""
        if not self._open or self._kafka is None:
            self._open = False
            return
        self._open = False
        kafka = self._kafka
        with map_rdkafka_errors():
            await self._blocking(lambda: kafka.abort_transaction(self._limit))


# The group coordinator's refusals of a member that is no longer in the group's generation
# (and ``_FENCED_CODES``: a producer of the same transactional id took over).
_FENCED_CODES = frozenset({ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED})
_ZOMBIE_CODES = frozenset(
    {
        ck.KafkaError.ILLEGAL_GENERATION,
        ck.KafkaError.UNKNOWN_MEMBER_ID,
        ck.KafkaError.FENCED_INSTANCE_ID,
    }
)


def _queue(
    produce: Any,
    topic: str,
    partition: int,
    records: Sequence[OutRecord],
    start: int,
    delivered: Any,
) -> int:
    """Queue ``records[start:]``; the index of the first one the full queue refused, or
    their end. Positional arguments: confluent-kafka parses keywords by name, one
    string lookup each, which cost ~1 us a record here (of ~2.5 in all;
    benchmarks/rdkafka_produce.py)."""
    i = start
    try:
        for i in range(start, len(records)):
            key, value, headers, ts = records[i]
            if headers or ts:
                hs = list(headers) if headers else None  # a list or a dict, not a tuple
                produce(topic, value, key, partition, delivered, None, ts or 0, hs)
            else:
                produce(topic, value, key, partition, delivered)
    except BufferError:
        return i
    return len(records)
