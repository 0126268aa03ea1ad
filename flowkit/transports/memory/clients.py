"""The clients of the embedded broker: ``MemoryConsumer``, ``MemoryProducer`` and
``MemoryTransport``, which puts the ``Transport`` protocol over a ``MemoryBroker``.

Several transports may share one broker, which is how tests simulate several workers, or
a worker restarting and resuming from its group's committed offsets.

Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from ..._text import count as plural
from ...errors import CommitFailed, ConfigurationError, RecordRejected, TransportError
from ...records import Headers, Message, TopicPartition, record_size
from ..base import Ack, OffsetReset, OutRecord, RebalanceListener, TimestampBounds, TopicSpec
from .broker import MemoryBroker

if TYPE_CHECKING:
    from ..base import Transport
    from .broker import _Log

__all__ = ["MemoryConsumer", "MemoryProducer", "MemoryTransport"]


class _Fetch:
    """Read state of one assigned partition."""

    __slots__ = ("log", "position", "tp")

    def __init__(self, tp: TopicPartition, log: _Log, position: int) -> None:
        self.tp = tp
        self.log = log
        self.position = position


class MemoryConsumer:
    """A ``Consumer`` on a ``MemoryBroker``; see ``flowkit.transports.base.Consumer``.

    Group members rebalance incrementally: at its next ``getmany`` a member is told
    ``on_partitions_revoked`` for the partitions it loses (it still owns them then, so it
    may commit), releases them, and only then may their new owner take them and be told
    ``on_partitions_assigned``. Closing leaves the group without a revoke callback, as
    Kafka clients do: commit before ``aclose``.
    """

    def __init__(
        self,
        broker: MemoryBroker,
        *,
        group_id: str | None,
        client_id: str = "flowkit",
        auto_offset_reset: OffsetReset = "earliest",
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise ConfigurationError(
                f"auto_offset_reset must be 'earliest' or 'latest', got {auto_offset_reset!r}"
            )
        self.member_id = broker.next_member_id(client_id)
        self._broker = broker
        self._group_id = group_id
        self._reset = auto_offset_reset
        self._listener: RebalanceListener | None = None
        self._fetches: dict[TopicPartition, _Fetch] = {}
        self._highwater: dict[TopicPartition, int] = {}
        self._rotation = 0
        self._rebalance_needed = False
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<MemoryConsumer {self.member_id} group={self._group_id!r}>"

    async def start(self) -> None:
        """Nothing to connect; a group member joins on ``subscribe``."""
        self._check_open()

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the group for ``topics`` (created if unknown); partitions come in ``getmany``."""
        self._check_open()
        if self._group_id is None:
            raise ConfigurationError("subscribe() needs a group_id; use assign() without one")
        self._listener = listener
        self._broker.join(self._group_id, self, tuple(topics))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions``: from the group's commit if any, else per reset."""
        self._check_open()
        if self._listener is not None:
            raise ConfigurationError("assign() on a consumer that subscribed to a group")
        wanted = set(partitions)
        logs = {tp: self._broker.log(tp) for tp in wanted}  # validate before changing
        for tp in self._fetches.keys() - wanted:
            self._drop(tp)
        for tp in wanted - self._fetches.keys():
            self._add(tp, logs[tp])
        self.poke()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now."""
        return set(self._fetches)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` on (reset as ``auto_offset_reset`` says if outside
        the log)."""
        self._check_open()
        f = self._fetch_state(tp)
        f.position = offset
        self._resolve(f)

    async def getmany(
        self, timeout: float, max_records: int
    ) -> dict[TopicPartition, list[Message]]:
        """Up to ``max_records`` records shared fairly among the ready partitions.

        Runs pending rebalance callbacks first. Waits up to ``timeout`` for a producer,
        a rebalance, an ``assign`` or ``aclose`` when nothing is ready.
        """
        self._check_open()
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        if self._rebalance_needed:
            await self._sync_group()
        batch = self._fetch(max_records)
        if batch or timeout <= 0 or self._closed:
            return batch
        fut = asyncio.get_running_loop().create_future()
        self._waiter = fut
        logs = [f.log for f in self._fetches.values()]
        for log in logs:
            log.waiters.add(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return {}
        finally:
            self._waiter = None
            for log in logs:
                log.waiters.discard(fut)
        if self._rebalance_needed:
            await self._sync_group()
        return self._fetch(max_records)  # {} if closed meanwhile: aclose drops every partition

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``getmany`` returns for ``tp``."""
        return self._resolve(self._fetch_state(tp))

    def highwater(self, tp: TopicPartition) -> int | None:
        """The log end offset of ``tp`` as of the last ``getmany`` (None before any)."""
        return self._highwater.get(tp)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Store the group's next offsets; every partition must be owned by this consumer."""
        if self._group_id is None:
            raise CommitFailed("cannot commit: this consumer has no group_id")
        if self._closed:
            raise CommitFailed(f"cannot commit: consumer {self.member_id} is closed")
        for tp, offset in offsets.items():
            if tp not in self._fetches:
                raise CommitFailed(
                    f"cannot commit {tp.topic}[{tp.partition}]: not assigned to"
                    f" {self.member_id} (revoked in a rebalance?)"
                )
            if offset < 0:
                raise CommitFailed(f"cannot commit negative offset {offset} for {tp}")
        self._broker.group(self._group_id).committed.update(offsets)

    async def aclose(self) -> None:
        """Leave the group, releasing every partition at once. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fetches.clear()
        if self._group_id is not None and self._listener is not None:
            self._broker.leave(self._group_id, self)
        self.poke()

    # -- internals ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"consumer {self.member_id} is closed")

    def poke(self, *, rebalance: bool = False) -> None:
        """Wake a waiting ``getmany``; with ``rebalance``, make it sync the group first."""
        if rebalance:
            self._rebalance_needed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fetch_state(self, tp: TopicPartition) -> _Fetch:
        f = self._fetches.get(tp)
        if f is None:
            raise TransportError(f"{tp.topic}[{tp.partition}] is not assigned to {self.member_id}")
        return f

    def _add(self, tp: TopicPartition, log: _Log) -> None:
        committed = None if self._group_id is None else self._broker.committed(self._group_id, tp)
        f = _Fetch(tp, log, -1 if committed is None else committed)
        self._resolve(f)
        self._fetches[tp] = f

    def _drop(self, tp: TopicPartition) -> None:
        del self._fetches[tp]
        self._highwater.pop(tp, None)

    def _resolve(self, f: _Fetch) -> int:
        """Apply ``auto_offset_reset`` when the position is unset or outside the log."""
        log = f.log
        if not log.base <= f.position <= log.end:
            f.position = log.base if self._reset == "earliest" else log.end
        return f.position

    async def _sync_group(self) -> None:
        self._rebalance_needed = False
        assert self._group_id is not None and self._listener is not None
        group = self._broker.group(self._group_id)
        lost = self._fetches.keys() - group.targets.get(self, set())
        if lost:
            # Revoke while still owning the partitions, so the listener can commit.
            try:
                await self._listener.on_partitions_revoked(set(lost))
            except BaseException:
                self._rebalance_needed = True  # not released: the next getmany tries again
                raise
            for tp in lost:
                if tp in self._fetches:
                    self._drop(tp)
                if group.holders.get(tp) is self:
                    del group.holders[tp]
            for member, target in group.targets.items():
                if member is not self and not target.isdisjoint(lost):
                    member.poke(rebalance=True)
        if self._closed:
            return
        # Partitions still held by their previous owner come later, when it releases them.
        target = group.targets.get(self, set())
        gained = {tp for tp in target if tp not in self._fetches and tp not in group.holders}
        if gained:
            for tp in gained:
                group.holders[tp] = self
                self._add(tp, self._broker.log(tp))
            await self._listener.on_partitions_assigned(set(gained))

    def _fetch(self, max_records: int) -> dict[TopicPartition, list[Message]]:
        fetches = list(self._fetches.values())
        if not fetches:
            return {}
        # Rotate the starting partition so a small max_records never starves the last ones.
        r = self._rotation = (self._rotation + 1) % len(fetches)
        highwater = self._highwater
        ready: list[_Fetch] = []
        avail: list[int] = []
        for f in fetches[r:] + fetches[:r]:
            log = f.log
            end = log.next_offset
            highwater[f.tp] = end
            position = f.position
            if not log.base <= position <= end:
                position = self._resolve(f)
            if end > position:
                ready.append(f)
                avail.append(end - position)
        if not ready:
            return {}
        if sum(avail) > max_records:
            # Water-filling: find the level that shares max_records fairly (what small
            # backlogs leave goes to the others), then hand out the rounding remainder in
            # the rotated order, so even max_records=1 visits every partition in turn.
            remaining, left, level = max_records, len(ready), 0
            for n in sorted(avail):
                level = remaining // left
                if n > level:
                    break
                remaining, left = remaining - n, left - 1
            takes = [min(n, level) for n in avail]
            extra = max_records - sum(takes)
            for i, n in enumerate(avail):
                if extra and n > takes[i]:
                    takes[i] += 1
                    extra -= 1
            avail = takes
        out: dict[TopicPartition, list[Message]] = {}
        for f, n in zip(ready, avail, strict=True):
            if n:
                log = f.log
                start = log.index(f.position)
                batch = out[f.tp] = log.messages[start : start + n]
                f.position = batch[-1].offset + 1
        return out


class MemoryProducer:
    """A ``Producer`` on a ``MemoryBroker``: ``send`` appends at once and is acked at once."""

    def __init__(self, broker: MemoryBroker, max_record_bytes: int | None = None) -> None:
        self._append = broker.append_one
        self._append_batch = broker.append_batch
        self._closed = False
        self.max_record_bytes = max_record_bytes

    async def start(self) -> None:
        """Nothing to connect."""
        if self._closed:
            raise TransportError("producer is closed")

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
        """Append the record; the returned awaitable is already done."""
        if self._closed:
            raise TransportError(f"cannot send to {topic!r}: producer is closed")
        if self.max_record_bytes is not None:
            size = record_size(key, value, headers)
            if size > self.max_record_bytes:
                raise RecordRejected(
                    f"a record of {size} bytes to {topic!r} is over max_record_bytes"
                    f" ({self.max_record_bytes})"
                )
        return self._append(topic, value, key, headers, partition, timestamp_ms)

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        """Append the records to ``partition``; one already done ``Ack``, of the last."""
        if self._closed:
            raise TransportError(f"cannot send to {topic!r}: producer is closed")
        ack = self._append_batch(topic, partition, records)
        return [] if ack is None else [(len(records), ack)]

    async def flush(self) -> None:
        """Nothing is ever pending."""

    async def aclose(self) -> None:
        """Refuse further sends. Idempotent."""
        self._closed = True


class MemoryTransport:
    """The ``Transport`` for ``memory://``: clients of one ``MemoryBroker``.

    With no ``broker`` it makes a fresh one. Pass the same broker to several transports
    to run several workers against one cluster. ``max_record_bytes`` makes its producers
    refuse larger records, as a Kafka producer does over its ``max_request_size``.
    ``aclose`` closes the consumers and producers it made (consumers leave their groups).
    """

    url = "memory://"

    def __init__(
        self, broker: MemoryBroker | None = None, *, max_record_bytes: int | None = None
    ) -> None:
        self.broker = MemoryBroker() if broker is None else broker
        self.max_record_bytes = max_record_bytes
        self._clients: list[MemoryConsumer | MemoryProducer] = []
        self._closed = False

    async def __aenter__(self) -> MemoryTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def consumer(
        self,
        *,
        group_id: str | None,
        client_id: str = "flowkit",
        auto_offset_reset: OffsetReset = "earliest",
    ) -> MemoryConsumer:
        """A new consumer; ``group_id=None`` reads only what is ``assign``ed."""
        self._check_open()
        consumer = MemoryConsumer(
            self.broker,
            group_id=group_id,
            client_id=client_id,
            auto_offset_reset=auto_offset_reset,
        )
        self._clients.append(consumer)
        return consumer

    def producer(self, *, client_id: str = "flowkit") -> MemoryProducer:
        """A new producer."""
        self._check_open()
        producer = MemoryProducer(self.broker, self.max_record_bytes)
        self._clients.append(producer)
        return producer

    def transactional_producer(
        self, *, transactional_id: str, client_id: str = "flowkit"
    ) -> NoReturn:
        """Refused: the memory broker has no transactions (exactly-once needs Kafka)."""
        raise ConfigurationError(
            "processing_guarantee='exactly_once' needs Kafka transactions, which the "
            "memory broker does not have: run the worker on kafka://... (Apache Kafka), or "
            "keep the default at_least_once"
        )

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create the missing topics; all or nothing if any count mismatches."""
        for spec in specs:
            count = self.broker.partition_count(spec.name)
            if count is not None and count != spec.partitions:
                raise ConfigurationError(
                    f"topic {spec.name!r} exists with {plural(count, 'partition')},"
                    f" not {spec.partitions}"
                )
        for spec in specs:
            self.broker.create_topic(spec.name, spec.partitions, compacted=spec.compacted)

    async def watch(self) -> None:
        """Nothing to watch: the broker lives in this process."""

    async def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if it does not exist."""
        return self.broker.partition_count(topic)

    async def timestamp_bounds(self, topic: str) -> TimestampBounds:
        """The memory broker takes any timestamp."""
        return (None, None)

    async def aclose(self) -> None:
        """Close every client this transport made. Idempotent."""
        self._closed = True
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("transport is closed")


if TYPE_CHECKING:

    def _conforms(t: MemoryTransport) -> Transport:
        return t  # mypy checks MemoryTransport against the protocol here
