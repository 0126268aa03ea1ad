"""``RdkafkaProducer``: a librdkafka producer behind the ``Producer`` protocol.

``produce`` only queues (it never blocks); acknowledgements come back through delivery
callbacks, which librdkafka runs inside ``poll``. A thread of the producer's own polls,
collects the callbacks, and hands each collection to the event loop in one call, where
the send futures are resolved: one loop wake-up per batch of acks, not per record.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

import confluent_kafka as ck

from ...errors import TransportError
from ...records import Headers
from ..base import Ack, OutRecord
from .errors import RDKAFKA_ERRORS, map_rdkafka_errors, translate

if TYPE_CHECKING:
    from .transport import RdkafkaTransport

__all__ = ["RdkafkaProducer"]

_Delivery = tuple["asyncio.Future[Ack]", Any, Any]


def _resolve(done: list[_Delivery]) -> None:
    # On the event loop: one call for every acknowledgement collected by one poll.
    for future, error, record in done:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(translate(ck.KafkaException(error)))
        else:
            future.set_result(Ack(record.topic(), record.partition(), record.offset()))


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
        self._done: list[_Delivery] = []
        self._lock = threading.Lock()
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
        await self._transport._connect(kafka)
        self._kafka = kafka
        self._poller = threading.Thread(
            target=self._poll, args=(kafka,), name="flowkit-rdkafka-producer", daemon=True
        )
        self._poller.start()

    def _on_error(self, error: Any) -> None:
        if error.fatal():
            self._fatal = translate(ck.KafkaException(error))
        else:
            self._transport._on_error(error)  # a lost connection: the broker watch checks

    def _poll(self, kafka: Any) -> None:
        while not self._stopping.is_set():
            kafka.poll(0.1)
            self._hand_over()

    def _hand_over(self) -> None:
        if self._done:
            with self._lock:
                done, self._done = self._done, []
            assert self._loop is not None
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(_resolve, done)

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
        delivered = _BatchDelivery(self, future, len(records)).delivered
        produce = self._kafka.produce
        for key, value, headers, ts in records:
            while True:
                try:
                    produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        on_delivery=delivered,
                        timestamp=ts or 0,
                        headers=list(headers) if headers else None,
                    )
                    break
                except BufferError:
                    # librdkafka's local queue is full: the poller drains it as acks arrive.
                    await asyncio.sleep(0.005)
                except RDKAFKA_ERRORS as exc:
                    raise translate(exc) from exc
        return future

    def _flush(self) -> None:
        kafka = self._kafka
        while kafka is not None and kafka.flush(0.5) > 0 and not self._stopping.is_set():
            pass
        self._hand_over()

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged (or failed).

        librdkafka sends at once on a flush rather than waiting out ``linger_ms``.
        """
        if self._kafka is not None:
            loop = asyncio.get_running_loop()
            with map_rdkafka_errors():
                await loop.run_in_executor(None, self._flush)

    async def aclose(self) -> None:
        """Flush and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._transport._opened.discard(self)
        if self._kafka is None:
            return
        try:
            await self.flush()
        finally:
            self._stopping.set()
            poller = self._poller
            if poller is not None:
                await asyncio.get_running_loop().run_in_executor(None, poller.join)
            self._hand_over()
            self._kafka = None


class _BatchDelivery:
    """Counts the delivery reports of one ``send`` or ``send_batch``; the last one hands its
    result (the first error, else the last record, which librdkafka reports last within a
    partition) to the event loop with the producer's other acks."""

    __slots__ = ("error", "future", "lock", "producer", "remaining")

    def __init__(self, producer: RdkafkaProducer, future: asyncio.Future[Ack], n: int) -> None:
        self.producer = producer
        self.future = future
        self.remaining = n
        self.error: Any = None
        self.lock = producer._lock  # reports come from the poller or a flushing thread

    def delivered(self, error: Any, record: Any) -> None:
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.remaining -= 1
            if self.remaining == 0:
                self.producer._done.append((self.future, self.error, record))
