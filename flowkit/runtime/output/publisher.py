"""Everything a worker sends goes through its ``Publisher``: outputs, changelogs, partials,
dead letters. It keeps the unacknowledged sends, so a checkpoint can wait for them all
before it commits, and the end offset written per partition, so the worker knows when its
own writes to a topic it also reads have been read back (``is_idle``).

Agent outputs and dead letters are *published*: placed in their destination partition's
buffer (a ``Lane`` per topic) as they come, or for dead letters at the start of the next
flush (``before_flush``: they are counted as buffered from the moment they are noted, and
built together there), and sent as one batch per partition when the
agent yields to the event loop (at the end of its input batch, or when it waits), when
the buffers are full, and before every checkpoint. The partition of a key is computed
once per key (a cache per partition count), and acks are tracked per broker batch, not
per record. Other sends (``send_bytes``) go one by one, after the buffered records of
their topic, so each partition keeps the order of the sends. ``when_acknowledged`` says
when everything published so far is acknowledged (the end-to-end latency's samples), at the
end of the flush round that sends it: the publisher counts rounds, not records.

A send the broker refuses for good (``RecordRejected``, found when its ack fails) is handed
with its ``origin`` (``settled``) to ``on_rejected``, which applies the error policy of the
record that caused it; the sends that makes are awaited before the checkpoint goes on. A
broker refuses a whole broker batch for one record in it (a timestamp out of its range,
say), and a client puts sends of one partition in one broker batch as it likes: so a
refusal is believed only for a record sent alone. The refused records are sent again in
halves, each awaited before the next, until each culprit stands alone; the others are
written (after records of their partition sent meanwhile). A refused send with no origin
(a changelog write) is a ``TransportError``: the worker stops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ...errors import RecordRejected, TransportError
from ...records import Headers, record_size
from ...transports import Ack, OutRecord, Producer
from ...transports.base import TimestampBounds
from .lanes import Group, KeyPartitions, Lane, settled

__all__ = ["Publisher", "Rejected"]

MAX_IN_FLIGHT = 10_000  # unacknowledged sends or batches before a sender waits
MAX_BUFFERED = 20_000  # published records held before the publisher sends them
Rejected = Callable[[object, RecordRejected], Awaitable[None]]
PartitionCount = Callable[[str], Awaitable[int | None]]
Bounds = Callable[[str], Awaitable[TimestampBounds]]


class _Batch:
    """The origin of a send: its records and, beside them, what caused each (a single
    send's partition may be None: the producer places it by its key)."""

    __slots__ = ("origins", "partition", "records", "topic")

    def __init__(
        self, topic: str, partition: int | None, records: list[OutRecord], origins: list[object]
    ) -> None:
        self.topic, self.partition, self.records, self.origins = topic, partition, records, origins


class Publisher:
    """Sends encoded records through one producer and tracks their acknowledgements."""

    def __init__(
        self,
        producer: Producer,
        on_rejected: Rejected | None = None,
        partition_count: PartitionCount | None = None,
        before_flush: Callable[[], None] | None = None,
        timestamp_bounds: Bounds | None = None,
    ) -> None:
        self.producer = producer
        self.on_rejected = on_rejected
        self._partition_count = partition_count
        # Per topic, how far from now it takes a timestamp given with ``send_bytes``
        # (``topic.send(timestamp_ms=)``): asked once, checked before the record is sent.
        self._timestamp_bounds = timestamp_bounds
        self._bounds: dict[str, TimestampBounds] = {}
        self.sent_end: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset
        self._in_flight: list[Awaitable[Ack]] = []
        self._origins: list[object] = []  # beside _in_flight: what caused each send, or None
        self._lanes: dict[str, Lane] = {}  # published, not yet sent: per topic
        self.buffered = 0  # records published since the last flush round began
        self._flushing: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._error: BaseException | None = None  # a background flush failed: raised next
        # Flush rounds begun; what waits for the end of one (``when_acknowledged``); the
        # sends a checkpoint is awaiting (taken from ``_in_flight``).
        self._round = 0
        self._round_waiters: list[tuple[int, Callable[[bool], None]]] = []
        self._awaiting: list[Awaitable[Ack]] = []
        self._watching: set[asyncio.Task[None]] = set()  # tasks of ``when_acknowledged``
        # Called at the start of every flush, to place records that were counted (by
        # ``placed``) but built late: dead letters, whose headers are made in a batch.
        self.before_flush = before_flush
        # A key's partition depends only on the key and the partition count: topics of the
        # same size share one cache, so a record fanned out to several is hashed once.
        self._key_partitions: dict[int, KeyPartitions] = {}
        limit = producer.max_record_bytes
        self.limit = limit if limit is not None else 1 << 62  # bytes a record may have

    @property
    def max_record_bytes(self) -> int | None:
        """The largest record the producer sends (key, value and headers), or None."""
        return self.producer.max_record_bytes

    # -- published records: buffered, sent in batches --------------------------------------

    def lane(self, topic: str) -> Lane:
        """The buffer of records published to ``topic``."""
        lane = self._lanes.get(topic)
        if lane is None:
            lane = self._lanes[topic] = Lane(topic, self.limit)
        return lane

    def publish(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        origin: object,
        timestamp_ms: int | None = None,
    ) -> bool:
        """Buffer one record for ``topic``; True when the caller should ``await relieve()``.

        Raises ``RecordRejected`` at once for a record over the producer's size limit.
        """
        self.place(topic, value, key, headers, origin, timestamp_ms)
        return self.placed(1)

    def place(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        origin: object,
        timestamp_ms: int | None = None,
    ) -> None:
        """Put one record in its topic's lane, without scheduling a flush: for the records
        that ``before_flush`` places (they were counted by ``placed`` when they came)."""
        lane = self._lanes.get(topic) or self.lane(topic)
        if not lane.add(key, value, headers, origin, timestamp_ms):
            # Over the limit, or the topic's partition count is not known yet.
            self._check_size(topic, key, value, headers)  # raises, with the message
            lane.put(key, value, headers, origin, timestamp_ms)

    def placed(self, n: int) -> bool:
        """``n`` records were put in lanes' ``parts`` (by ``publish``, or by an emitter
        directly): the flush is scheduled; True when the caller should ``await relieve()``."""
        self.buffered += n
        if self._flushing is None:
            if self._error is not None:  # the last flush failed: stop sending
                raise TransportError(f"a send failed: {self._error!r}") from self._error
            # Runs when the agent next yields to the loop: at the end of its input batch,
            # or sooner if it waits. One flush task at a time keeps each partition in order.
            self._flushing = asyncio.get_running_loop().create_task(self._flush_soon())
        return self.buffered >= MAX_BUFFERED or len(self._in_flight) >= MAX_IN_FLIGHT

    async def relieve(self) -> None:
        """Send what is buffered and, if too much is unacknowledged, wait for acks."""
        await self.flush()
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            await self.await_acks()

    async def _flush_soon(self) -> None:
        try:
            while self.buffered:  # what the agent publishes meanwhile, too
                await self._flush_round()  # a task of its own already: nothing cancels it
        except Exception as exc:  # raised by the next checkpoint, which stops the worker
            self._error = exc
        finally:
            self._flushing = None

    async def flush(self) -> None:
        """Send every record published so far, one batch per destination partition.

        The round runs as a task of its own: a caller cancelled meanwhile (the worker
        stops) leaves it to finish, so records taken from the lanes are never dropped half
        sent, and a failure is raised by the next ``await_acks``.
        """
        if not (self.buffered or self._flush_lock.locked() or self._any_queued()):
            return  # nothing to send, no round to wait for: no task, no turn of the loop
        sending = asyncio.get_running_loop().create_task(self._flush_round())
        try:
            await asyncio.shield(sending)
        except asyncio.CancelledError:
            if not sending.done():
                sending.add_done_callback(self._orphan_ended)
            raise

    def _any_queued(self) -> bool:
        return any(lane.queued() for lane in self._lanes.values())

    def _orphan_ended(self, sending: asyncio.Task[None]) -> None:
        if not sending.cancelled() and sending.exception() is not None and self._error is None:
            self._error = sending.exception()

    async def _flush_round(self) -> None:
        async with self._flush_lock:  # batches of one partition leave in order
            # One round: the records published while it sends go in the next one, so a
            # busy agent cannot keep a checkpoint waiting for the lock (it is fair).
            self.buffered = 0
            self._round += 1
            try:
                if self.before_flush is not None:
                    self.before_flush()
                rounds = [(lane, lane.take()) for lane in self._lanes.values()]
                for lane, (loose, placed) in rounds:
                    if loose[0]:  # published before the count was known: they came first
                        await self._send_loose(lane, *loose)
                    for p, records, origins in placed:
                        await self._send_partition(lane.topic, p, records, origins)
            except BaseException:
                if self._round_waiters:
                    self._round_ended(ok=False)
                raise
            if self._round_waiters:
                self._round_ended(ok=True)

    async def prepare(self) -> None:
        """Ask the partition count of every topic that has a lane, so their records are
        placed from the first one on (a count not known yet is asked again by a flush)."""
        for lane in list(self._lanes.values()):
            if lane.count == 0:
                await self._learn(lane, keep_unknown=False)

    async def _learn(self, lane: Lane, *, keep_unknown: bool = True) -> None:
        count = await self._partition_count(lane.topic) if self._partition_count else None
        if count is None:
            if keep_unknown:
                lane.count = None  # the producer places each record
            return
        keys = self._key_partitions.get(count)
        if keys is None:
            keys = self._key_partitions[count] = KeyPartitions(count)
        lane.known(count, keys)  # from now on, placed at once

    async def _send_loose(
        self, lane: Lane, records: list[OutRecord], origins: list[object]
    ) -> None:
        topic = lane.topic
        if lane.count == 0:
            await self._learn(lane)
        count = lane.count
        if count is None:  # unknown topic: the producer places each record
            for (key, value, headers, ts), origin in zip(records, origins, strict=True):
                await self._send_one(topic, value, key, headers, None, ts, origin)
            return
        by_partition: dict[int, Group] = {}
        for record, origin in zip(records, origins, strict=True):
            p = lane.partition(record[0])
            group = by_partition.get(p)
            if group is None:
                group = by_partition[p] = ([], [])
            group[0].append(record)
            group[1].append(origin)
        for p, (batch, causes) in by_partition.items():
            await self._send_partition(topic, p, batch, causes)

    def _queued(self, topic: str) -> bool:
        # Records of ``topic`` wait to be sent, or a flush round that may hold some is on.
        lane = self._lanes.get(topic)
        return self._flush_lock.locked() or (lane is not None and lane.queued())

    async def send_batch(self, topic: str, partition: int, records: list[OutRecord]) -> None:
        """Send records (of no agent: changelogs) to one partition as broker batches; the
        acks are awaited before the next commit. Raises ``RecordRejected`` at once for a
        record over the producer's size limit."""
        for key, value, headers, _ in records:
            self._check_size(topic, key, value, headers)
        if self._queued(topic):
            await self.flush()  # published records of this topic first: keep the order
        await self._send_partition(topic, partition, records, [None] * len(records))

    def _check_size(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        size = record_size(key, value, headers)
        if size > self.limit:
            raise RecordRejected(
                f"a record of {size} bytes to {topic!r} is over the producer's limit "
                f"({self.limit} bytes)"
            )

    async def _send_partition(
        self, topic: str, partition: int, batch: list[OutRecord], causes: list[object]
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
        origin: object = None,
    ) -> Awaitable[Ack]:
        """Send encoded bytes; the ack is awaited before the next commit.

        Raises ``RecordRejected`` if the producer refuses the record at once (too large),
        or if its timestamp is outside what the topic takes; if the broker refuses it later,
        ``on_rejected(origin, error)`` is called then.
        """
        if timestamp_ms is not None and self._timestamp_bounds is not None:
            # Refused now, the record fails alone; refused in its ack, it would abort an
            # exactly-once transaction, and every record in it with it.
            await self._check_timestamp(topic, timestamp_ms)
        if self._queued(topic):
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
        self._origins.append(_single(topic, partition, key, value, headers, timestamp_ms, origin))
        if len(in_flight) >= MAX_IN_FLIGHT:
            await self.await_acks()
        # The caller may await it in a task that is then cancelled (an agent, at a stop):
        # a view, so that this cannot cancel the send that the checkpoint still awaits.
        return asyncio.shield(ack) if isinstance(ack, asyncio.Future) else ack

    async def _check_timestamp(self, topic: str, timestamp_ms: int) -> None:
        bounds = self._bounds.get(topic)
        if bounds is None:
            assert self._timestamp_bounds is not None
            bounds = self._bounds[topic] = await self._timestamp_bounds(topic)
        ahead, behind = bounds
        if ahead is None and behind is None:
            return
        now = int(time.time() * 1000)  # the wall clock: the broker compares with its own
        if ahead is not None and timestamp_ms > now + ahead:
            raise RecordRejected(
                f"a record stamped {timestamp_ms} ms is {(timestamp_ms - now) / 1000:g} s "
                f"ahead of now; topic {topic!r} takes at most {ahead / 1000:g} s "
                "(message.timestamp.after.max.ms)"
            )
        if behind is not None and timestamp_ms < now - behind:
            raise RecordRejected(
                f"a record stamped {timestamp_ms} ms is {(now - timestamp_ms) / 1000:g} s "
                f"behind now; topic {topic!r} takes at most {behind / 1000:g} s "
                "(message.timestamp.before.max.ms)"
            )

    async def _send_one(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
        timestamp_ms: int | None,
        origin: object,
    ) -> Awaitable[Ack]:
        ack = await self.producer.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if isinstance(ack, Ack):  # already stored (the memory broker): nothing to await
            self._stored(ack)
            return ack
        self._in_flight.append(ack)
        self._origins.append(_single(topic, partition, key, value, headers, timestamp_ms, origin))
        return ack

    def _stored(self, ack: Ack) -> None:
        # A plain tuple hashes and compares like the TopicPartition namedtuple.
        tp = (ack.topic, ack.partition)
        sent = self.sent_end
        if ack.offset >= sent.get(tp, 0):
            sent[tp] = ack.offset + 1

    # -- acknowledgements -----------------------------------------------------------------

    def when_acknowledged(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(True)`` once every record published so far is acknowledged by
        the broker (``False`` if a send failed), without sending anything early: the
        records still buffered go with the flush round that would send them anyway."""
        if self.buffered:
            self._round_waiters.append((self._round + 1, callback))  # the next round's
        elif self._flush_lock.locked():
            self._round_waiters.append((self._round, callback))  # the round under way's
        else:
            self._watch(callback)

    def _round_ended(self, *, ok: bool) -> None:
        # Within the round's lock: its sends are in ``_in_flight`` still (a checkpoint
        # moves them to ``_awaiting`` only after a round).
        now = self._round
        due = [callback for until, callback in self._round_waiters if until <= now]
        self._round_waiters = [(u, c) for u, c in self._round_waiters if u > now]
        for callback in due:
            if ok:
                self._watch(callback)
            else:
                callback(False)

    def _watch(self, callback: Callable[[bool], None]) -> None:
        # Every send not acknowledged yet: those of the records in question and, at
        # worst, some older ones, which the broker acknowledges first.
        pending = [
            ack
            for ack in (*self._awaiting, *self._in_flight)
            if not isinstance(ack, Ack) and not ack.done()  # type: ignore[attr-defined]
        ]
        if not pending:
            callback(True)
            return
        task = asyncio.get_running_loop().create_task(_all_acknowledged(pending, callback))
        self._watching.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._watching.discard)

    def stop_watching(self) -> None:
        """Cancel what ``when_acknowledged`` still waits for (the worker stops)."""
        for task in list(self._watching):
            task.cancel()

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
            self._awaiting = pending
            refused: list[tuple[int, RecordRejected]] = []  # (index in pending, refusal)
            ack: Ack
            i = 0
            try:
                for i, sent in enumerate(pending):
                    try:
                        if isinstance(sent, Ack):  # already stored
                            ack = sent
                        elif sent.done():  # type: ignore[attr-defined]
                            ack = sent.result()  # type: ignore[attr-defined]
                        else:  # shielded: a cancelled wait leaves the send itself alone
                            ack = await asyncio.shield(sent)
                    except RecordRejected as exc:
                        if origins[i] is None or self.on_rejected is None:
                            raise TransportError(f"a send was refused: {exc}") from exc
                        refused.append((i, exc))
                        continue
                    except Exception as exc:
                        raise TransportError(f"a send was not acknowledged: {exc!r}") from exc
                    self._stored(ack)
                i = len(pending)
                if not refused:
                    return
                while refused:
                    await self._refused(origins[refused[0][0]])
                    del refused[0]
            except asyncio.CancelledError:
                # The sends go on (the shield kept the client's delivery futures): the next
                # checkpoint awaits what this one had not, and dead-letters the refused.
                back = [j for j, _ in refused] + list(range(i, len(pending)))
                self._in_flight[:0] = [pending[j] for j in back]
                self._origins[:0] = [origins[j] for j in back]
                raise
            finally:
                self._awaiting = []
            await self.flush()  # what the dead letters sent, awaited next round

    async def _refused(self, origin: object) -> None:
        """A send refused in its ack: its records go again until each culprit is alone."""
        # Every send with an origin keeps its records beside it (a _Batch): see send_bytes.
        assert isinstance(origin, _Batch), origin
        async with self._flush_lock:  # no send of ours joins theirs meanwhile
            culprits = await self._isolate(origin)
        for cause, refusal in culprits:
            if cause is None:
                raise TransportError(f"a send was refused: {refusal}") from refusal
            assert self.on_rejected is not None
            await self.on_rejected(settled(cause), refusal)

    async def _isolate(self, batch: _Batch) -> list[tuple[object, RecordRejected]]:
        """Send the records of a refused ``batch`` again, in halves, each awaited before the
        next, until every refused record was sent alone: those, with their refusals."""
        culprits: list[tuple[object, RecordRejected]] = []
        # Parts to send, in partition order: (records, causes, the refusal if sent alone).
        todo: list[tuple[list[OutRecord], list[object], RecordRejected | None]] = []
        # A single send too: the client may have put others in its broker batch.
        todo += _halves(batch.records, batch.origins, None)
        while todo:
            records, causes, alone = todo.pop(0)
            if alone is not None and len(records) == 1:
                culprits.append((causes[0], alone))
                continue
            refused = await self._send_awaited(batch.topic, batch.partition, records)
            for start, end, refusal in reversed(refused):  # each refused broker batch
                part, why = records[start:end], causes[start:end]
                todo[:0] = _halves(part, why, refusal if len(part) == 1 else None)
        return culprits

    async def _send_awaited(
        self, topic: str, partition: int | None, records: list[OutRecord]
    ) -> list[tuple[int, int, RecordRejected]]:
        """Send ``records`` and wait for their acks: the refused broker batches, as
        (start, end, refusal) in ``records``."""
        if partition is None:  # a single send the producer placed
            key, value, headers, ts = records[0]
            one = await self.producer.send(topic, value, key=key, headers=headers, timestamp_ms=ts)
            sends: list[tuple[int, Awaitable[Ack]]] = [(1, one)]
        else:
            sends = await self.producer.send_batch(topic, partition, records)
        refused = []
        start = 0
        for n, sent in sends:
            try:
                ack = sent if isinstance(sent, Ack) else await asyncio.shield(sent)
            except RecordRejected as refusal:
                refused.append((start, start + n, refusal))
            except Exception as error:
                raise TransportError(f"a send was not acknowledged: {error!r}") from error
            else:
                self._stored(ack)
            start += n
        return refused

    def all_acked(self) -> bool:
        """True when nothing is buffered and every send so far is acknowledged (and none
        failed)."""
        if self.buffered or self._error is not None or self._flush_lock.locked():
            return False
        if self._any_queued():
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


async def _all_acknowledged(
    pending: list[Awaitable[Ack]], callback: Callable[[bool], None]
) -> None:
    # Shielded: cancelling the watch (the worker stops) must not cancel the sends.
    results = await asyncio.gather(*map(asyncio.shield, pending), return_exceptions=True)
    callback(not any(isinstance(r, BaseException) for r in results))


def _single(
    topic: str,
    partition: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    timestamp_ms: int | None,
    origin: object,
) -> _Batch | None:
    """The origin kept for a single send: the record itself beside what caused it, should
    it have to be sent again alone (see ``_refused``); None for a send of no record's."""
    if origin is None:
        return None
    return _Batch(topic, partition, [(key, value, headers, timestamp_ms)], [origin])


def _halves(
    records: list[OutRecord], causes: list[object], alone: RecordRejected | None
) -> list[tuple[list[OutRecord], list[object], RecordRejected | None]]:
    """A refused part to send again: as two halves, or whole if it is one record (with
    its refusal if it was sent alone: then it is the culprit)."""
    if len(records) == 1:
        return [(records, causes, alone)]
    mid = len(records) // 2
    return [(records[:mid], causes[:mid], None), (records[mid:], causes[mid:], None)]
