"""Everything a worker sends goes through its ``Publisher``: outputs, changelogs, partials,
dead letters. It keeps the unacknowledged sends, so a checkpoint can wait for them all
before it commits, and the end offset written per partition, so the worker knows when its
own writes to a topic it also reads have been read back (``is_idle``).

Agent outputs and dead letters are *published*: buffered per topic, and sent as one batch
per destination partition when the agent yields to the event loop (at the end of its
input batch, or when it waits), when a buffer is full, and before every checkpoint. The
partition of a key is looked up once per key (a cache per topic), and acks are tracked
per broker batch, not per record. Other sends (``send_bytes``) go one by one, after the
buffered records of their topic, so each partition keeps the order of the sends.

A send the broker refuses for good (``RecordRejected``, found when its ack fails) is handed
with its ``origin`` to ``on_rejected``, which applies the error policy of the record that
caused it; the sends that makes are awaited before the checkpoint goes on. When a whole
batch is refused, its records are sent again one by one, so only the culprit is refused. A
refused send with no origin (a changelog write) is a ``TransportError``: the worker stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import RecordRejected, TransportError
from ..partitioning import partition_for_key
from ..records import Headers
from ..transports import Ack, OutRecord, Producer

__all__ = ["Publisher", "Rejected"]

MAX_IN_FLIGHT = 10_000  # unacknowledged sends or batches before a sender waits
MAX_BUFFERED = 20_000  # published records held before the publisher sends them
_KEY_CACHE = 100_000  # keys whose partition is remembered, per partition count

Rejected = Callable[[Any, RecordRejected], Awaitable[None]]
PartitionCount = Callable[[str], Awaitable[int | None]]


class _Batch:
    """The origin of a batch send: its records and, beside them, what caused each."""

    __slots__ = ("origins", "partition", "records", "topic")

    def __init__(
        self, topic: str, partition: int, records: list[OutRecord], origins: list[Any]
    ) -> None:
        self.topic, self.partition, self.records, self.origins = topic, partition, records, origins


class Publisher:
    """Sends encoded records through one producer and tracks their acknowledgements."""

    def __init__(
        self,
        producer: Producer,
        on_rejected: Rejected | None = None,
        partition_count: PartitionCount | None = None,
    ) -> None:
        self.producer = producer
        self.on_rejected = on_rejected
        self._partition_count = partition_count
        self.sent_end: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset
        self._in_flight: list[Awaitable[Any]] = []
        self._origins: list[Any] = []  # beside _in_flight: what caused each send, or None
        # Published, not yet sent: per topic, the records and (beside them) their origins.
        self._buffers: dict[str, tuple[list[OutRecord], list[Any]]] = {}
        self._buffered = 0
        self._flushing: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._error: BaseException | None = None  # a background flush failed: raised next
        self._partitions: dict[str, int | None] = {}
        # A key's partition depends only on the key and the partition count: topics of the
        # same size share one cache, so a record fanned out to several is hashed once.
        self._key_partitions: dict[int, dict[bytes, int]] = {}
        self._spread: dict[str, int] = {}  # keyless records: the partition of the next flush
        limit = producer.max_record_bytes
        self._limit = limit if limit is not None else 1 << 62

    @property
    def max_record_bytes(self) -> int | None:
        """The largest record the producer sends (key, value and headers), or None."""
        return self.producer.max_record_bytes

    # -- published records: buffered, sent in batches --------------------------------------

    def publish(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        origin: Any,
        timestamp_ms: int | None = None,
    ) -> bool:
        """Buffer one record for ``topic``; True when the caller should ``await relieve()``.

        Raises ``RecordRejected`` at once for a record over the producer's size limit.
        """
        # The check of _check_size, inlined: this runs per output, and the call alone added
        # ~1 % to the router's instructions per order.
        size = (0 if value is None else len(value)) + (0 if key is None else len(key))
        if headers:
            for name, data in headers:
                size += len(name) + len(data)
        if size > self._limit:
            self._check_size(topic, key, value, headers)  # raises, with the message
        buffer = self._buffers.get(topic)
        if buffer is None:
            buffer = self._buffers[topic] = ([], [])
        buffer[0].append((key, value, headers, timestamp_ms))
        buffer[1].append(origin)
        self._buffered += 1
        if self._flushing is None:
            if self._error is not None:  # the last flush failed: stop sending
                raise TransportError(f"a send failed: {self._error!r}") from self._error
            # Runs when the agent next yields to the loop: at the end of its input batch,
            # or sooner if it waits. One flush task at a time keeps each partition in order.
            self._flushing = asyncio.get_running_loop().create_task(self._flush_soon())
        return self._buffered >= MAX_BUFFERED or len(self._in_flight) >= MAX_IN_FLIGHT

    async def relieve(self) -> None:
        """Send what is buffered and, if too much is unacknowledged, wait for acks."""
        await self.flush()
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            await self.await_acks()

    async def _flush_soon(self) -> None:
        try:
            while self._buffers:  # what the agent publishes meanwhile, too
                await self.flush()
        except Exception as exc:  # raised by the next checkpoint, which stops the worker
            self._error = exc
        finally:
            self._flushing = None

    async def flush(self) -> None:
        """Send every record published so far, one batch per destination partition."""
        async with self._flush_lock:  # batches of one partition leave in order
            # One round: the records published while it sends go in the next one, so a
            # busy agent cannot keep a checkpoint waiting for the lock (it is fair).
            buffers, self._buffers, self._buffered = self._buffers, {}, 0
            for topic, (records, origins) in buffers.items():
                await self._send_topic(topic, records, origins)

    async def _send_topic(self, topic: str, records: list[OutRecord], origins: list[Any]) -> None:
        count = self._partitions.get(topic, 0)
        if count == 0:
            count = self._partitions[topic] = (
                await self._partition_count(topic) if self._partition_count else None
            )
        if count is None:  # unknown topic: the producer places each record
            for (key, value, headers, ts), origin in zip(records, origins, strict=True):
                await self._send_one(topic, value, key, headers, None, ts, origin)
            return
        cache = self._key_partitions.get(count)
        if cache is None or len(cache) >= _KEY_CACHE:
            cache = self._key_partitions[count] = {}
        spread = self._spread.get(topic, 0)
        self._spread[topic] = (spread + 1) % count  # keyless: one partition per flush
        by_partition: dict[int, tuple[list[OutRecord], list[Any]]] = {}
        for record, origin in zip(records, origins, strict=True):
            key = record[0]
            if key is None:
                p = spread
            else:
                p = cache.get(key, -1)
                if p < 0:
                    p = cache[key] = partition_for_key(key, count)
            group = by_partition.get(p)
            if group is None:
                group = by_partition[p] = ([], [])
            group[0].append(record)
            group[1].append(origin)
        for p, (batch, causes) in by_partition.items():
            await self._send_partition(topic, p, batch, causes)

    async def send_batch(self, topic: str, partition: int, records: list[OutRecord]) -> None:
        """Send records (of no agent: changelogs) to one partition as broker batches; the
        acks are awaited before the next commit. Raises ``RecordRejected`` at once for a
        record over the producer's size limit."""
        for key, value, headers, _ in records:
            self._check_size(topic, key, value, headers)
        if topic in self._buffers:
            await self.flush()  # published records of this topic first: keep the order
        await self._send_partition(topic, partition, records, [None] * len(records))

    def _check_size(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        size = (0 if value is None else len(value)) + (0 if key is None else len(key))
        if headers:
            for name, data in headers:
                size += len(name) + len(data)
        if size > self._limit:
            raise RecordRejected(
                f"a record of {size} bytes to {topic!r} is over the producer's limit "
                f"({self._limit} bytes)"
            )

    async def _send_partition(
        self, topic: str, partition: int, batch: list[OutRecord], causes: list[Any]
    ) -> None:
        """Send ``batch`` (caused by ``causes``, one each) and track its acks."""
        start = 0
        for n, ack in await self.producer.send_batch(topic, partition, batch):
            if isinstance(ack, Ack):
                self._stored(ack)
            else:
                end = start + n
                self._in_flight.append(ack)
                self._origins.append(_Batch(topic, partition, batch[start:end], causes[start:end]))
            start += n

    # -- single sends ---------------------------------------------------------------------

    async def send_bytes(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
        origin: Any = None,
    ) -> Awaitable[Any]:
        """Send encoded bytes; the ack is awaited before the next commit.

        Raises ``RecordRejected`` if the producer refuses the record at once (too large);
        if the broker refuses it later, ``on_rejected(origin, error)`` is called then.
        """
        if topic in self._buffers:
            await self.flush()  # published records of this topic first: keep the order
        # Inlined (not _send_one): changelogs and partials come here, one coroutine each.
        ack = await self.producer.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if isinstance(ack, Ack):  # already stored (the memory broker): nothing to await
            self._stored(ack)
            return ack
        in_flight = self._in_flight
        in_flight.append(ack)
        self._origins.append(origin)
        if len(in_flight) >= MAX_IN_FLIGHT:
            await self.await_acks()
        return ack

    async def _send_one(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
        timestamp_ms: int | None,
        origin: Any,
    ) -> Awaitable[Any]:
        ack = await self.producer.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if isinstance(ack, Ack):  # already stored (the memory broker): nothing to await
            self._stored(ack)
            return ack
        self._in_flight.append(ack)
        self._origins.append(origin)
        return ack

    def _stored(self, ack: Ack) -> None:
        # A plain tuple hashes and compares like the TopicPartition namedtuple.
        tp = (ack.topic, ack.partition)
        sent = self.sent_end
        if ack.offset >= sent.get(tp, 0):
            sent[tp] = ack.offset + 1

    # -- acknowledgements -----------------------------------------------------------------

    async def await_acks(self) -> None:
        """Send what is published, then wait until every send so far is acknowledged or,
        if refused for good, handed to ``on_rejected`` (and what that sent is acknowledged
        too); raises ``TransportError`` for any other failed send."""
        await self.flush()
        if self._error is not None:
            error, self._error = self._error, None
            raise TransportError(f"a send failed: {error!r}") from error
        while self._in_flight:
            pending, self._in_flight = self._in_flight, []
            origins, self._origins = self._origins, []
            rejected: list[tuple[Any, RecordRejected]] = []
            for ack, origin in zip(pending, origins, strict=True):
                if not isinstance(ack, Ack):  # an Ack is already stored; others are futures
                    try:
                        ack = await ack
                    except RecordRejected as exc:
                        if origin is None or self.on_rejected is None:
                            raise TransportError(f"a send was refused: {exc}") from exc
                        rejected.append((origin, exc))
                        continue
                    except Exception as exc:
                        raise TransportError(f"a send was not acknowledged: {exc!r}") from exc
                self._stored(ack)
            if not rejected:
                return
            for origin, refusal in rejected:
                await self._refused(origin, refusal)  # what it sends: awaited next round
            await self.flush()

    async def _refused(self, origin: Any, exc: RecordRejected) -> None:
        if isinstance(origin, _Batch):
            if len(origin.records) > 1:
                # Which record? Send each alone: the broker refuses only the culprit.
                for (key, value, headers, ts), cause in zip(
                    origin.records, origin.origins, strict=True
                ):
                    await self.send_bytes(
                        origin.topic,
                        value,
                        key=key,
                        headers=headers,
                        partition=origin.partition,
                        timestamp_ms=ts,
                        origin=cause,
                    )
                return
            origin = origin.origins[0]
            if origin is None:
                raise TransportError(f"a send was refused: {exc}") from exc
        assert self.on_rejected is not None
        await self.on_rejected(origin, exc)

    def all_acked(self) -> bool:
        """True when nothing is buffered and every send so far is acknowledged (and none
        failed)."""
        if self._buffered or self._buffers or self._error is not None:
            return False
        for ack in self._in_flight:
            if isinstance(ack, Ack):
                continue
            if not ack.done():  # type: ignore[attr-defined]
                return False
            try:
                self._stored(ack.result())  # type: ignore[attr-defined]
            except Exception:
                return False  # a failed send: the next checkpoint handles it
        return True
