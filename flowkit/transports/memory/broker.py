"""The embedded broker itself: partitioned logs, consumer groups, retention, compaction.

``MemoryBroker`` is a small Kafka: named topics with N partitions, each an append-only log
with offsets; consumer groups with committed offsets and range assignment across members;
bounded memory through per-partition retention. Its clients (``MemoryConsumer``,
``MemoryProducer``, ``MemoryTransport``) are in ``flowkit.transports.memory.clients``; they
use the underscored methods below, which are this package's internals.

Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import bisect
import sys
import time
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING

from ..._text import count as plural
from ...errors import ConfigurationError, TransportError
from ...partitioning import partition_for_key
from ...records import Headers, Message, TopicPartition
from ..base import Ack, OutRecord

if TYPE_CHECKING:
    from .clients import MemoryConsumer

__all__ = ["MemoryBroker"]


class _DoneAck(Ack):
    """An ``Ack`` that is its own completed awaitable: the memory broker acks on append.

    Measured cheaper than a finished ``asyncio.Future`` (about half, awaited). It compares,
    hashes and prints as a plain ``Ack``.
    """

    __slots__ = ()

    def __await__(self) -> Generator[None, None, Ack]:
        yield from ()
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ack):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = Ack.__hash__

    def __repr__(self) -> str:
        return f"Ack(topic={self.topic!r}, partition={self.partition}, offset={self.offset})"


# A frozen dataclass __init__ costs about twice these slot setters; this is the hot path.
_new = object.__new__
_set_topic = Ack.__dict__["topic"].__set__
_set_partition = Ack.__dict__["partition"].__set__
_set_offset = Ack.__dict__["offset"].__set__


def _fields(ack: Ack) -> tuple[str, int, int]:
    return ack.topic, ack.partition, ack.offset


def _done_ack(topic: str, partition: int, offset: int) -> _DoneAck:
    ack = _new(_DoneAck)
    _set_topic(ack, topic)
    _set_partition(ack, partition)
    _set_offset(ack, offset)
    return ack


_COMPACT_AT = 10_000  # a compacted log's length at which its first compaction pass runs


class _Log:
    """One partition: ``messages[i]`` has offset ``base + i``, until compaction leaves gaps
    (``gapped``); then an offset's index is found by bisection."""

    __slots__ = ("base", "gapped", "messages", "next_offset", "trim_at", "waiters")

    def __init__(self, trim_at: int) -> None:
        self.messages: list[Message] = []
        self.base = 0
        self.next_offset = 0
        self.gapped = False
        self.trim_at = trim_at  # length at which the next retention or compaction pass runs
        self.waiters: set[asyncio.Future[None]] = set()

    @property
    def end(self) -> int:
        return self.next_offset

    def index(self, offset: int) -> int:
        """The index of the first message at or after ``offset``."""
        if not self.gapped:
            return offset - self.base
        return bisect.bisect_left(self.messages, offset, key=_offset_of)

    def compact(self) -> None:
        """Keep the newest record of each key (keyless records stay), in offset order."""
        newest: dict[bytes, int] = {}
        messages = self.messages
        for i, m in enumerate(messages):
            if m.key is not None:
                newest[m.key] = i
        kept = [m for i, m in enumerate(messages) if m.key is None or newest[m.key] == i]
        if len(kept) < len(messages):
            self.messages = kept
            self.gapped = True
            self.base = kept[0].offset if kept else self.next_offset


def _offset_of(message: Message) -> int:
    return message.offset


class _Topic:
    __slots__ = ("compacted", "key_partitions", "logs", "next_partition")

    def __init__(self, logs: list[_Log], compacted: bool) -> None:
        self.logs = logs
        self.compacted = compacted
        self.next_partition = 0
        # murmur2 in Python costs ~3 us a key; streams repeat keys, so remember (bounded).
        self.key_partitions: dict[bytes, int] = {}


class _Group:
    __slots__ = ("committed", "holders", "members", "targets")

    def __init__(self) -> None:
        self.members: dict[MemoryConsumer, tuple[str, ...]] = {}  # in join order
        self.targets: dict[MemoryConsumer, set[TopicPartition]] = {}
        self.holders: dict[TopicPartition, MemoryConsumer] = {}  # not yet released
        self.committed: dict[TopicPartition, int] = {}


_KEY_CACHE_SIZE = 1 << 16


def _wake(waiters: set[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()


class MemoryBroker:
    """An in-process cluster: topics of partitioned logs, and consumer groups.

    Unknown topics are created on first produce or subscribe with ``default_partitions``
    (1, as Kafka's ``num.partitions``). ``retention_records`` bounds each partition: once a
    log grows a quarter past it, records below the committed offset of *every* group that
    committed on that partition are dropped down to the bound. A partition no group has
    committed on keeps everything. Compacted topics are never trimmed: once a log grows
    past 10,000 records (or twice what the last pass kept), it keeps only the newest
    record of each key. ``None`` keeps everything else. ``clock`` gives wall-clock seconds for
    record timestamps.

    >>> broker = MemoryBroker(default_partitions=2)
    >>> broker.append("t", b"v", key=b"k")
    Ack(topic='t', partition=0, offset=0)
    >>> [m.value for m in broker.messages("t", 0)]
    [b'v']
    """

    def __init__(
        self,
        *,
        default_partitions: int = 1,
        retention_records: int | None = 1_000_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if default_partitions < 1:
            raise ConfigurationError(f"default_partitions must be >= 1, got {default_partitions}")
        if retention_records is not None and retention_records < 1:
            raise ConfigurationError(f"retention_records must be >= 1, got {retention_records}")
        self.default_partitions = default_partitions
        self.retention_records = retention_records
        self._slack = max(1, (retention_records or 0) // 4)  # trim in chunks, not per append
        self._clock = clock
        self._topics: dict[str, _Topic] = {}
        self._groups: dict[str, _Group] = {}
        self._member_seq = 0

    def create_topic(self, name: str, partitions: int, *, compacted: bool = False) -> None:
        """Create ``name`` unless it exists with the same partition count.

        Raises ``ConfigurationError`` if it exists with another count.
        """
        existing = self._topics.get(name)
        if existing is not None:
            if len(existing.logs) != partitions:
                raise ConfigurationError(
                    f"topic {name!r} exists with {plural(len(existing.logs), 'partition')},"
                    f" not {partitions}"
                )
            return
        if partitions < 1:
            raise ConfigurationError(f"topic {name!r} needs at least 1 partition, got {partitions}")
        retention = self.retention_records
        if compacted:  # compaction, not retention: bounded by the number of keys
            trim_at = _COMPACT_AT
        else:
            trim_at = sys.maxsize if retention is None else retention + self._slack
        self._topics[name] = _Topic([_Log(trim_at) for _ in range(partitions)], compacted)

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if it does not exist."""
        t = self._topics.get(topic)
        return None if t is None else len(t.logs)

    def is_compacted(self, topic: str) -> bool:
        """Whether ``topic`` was created as compacted (its logs keep the newest record per
        key once they grow past the retention size, as Kafka's log cleaner does)."""
        t = self._topics.get(topic)
        return t is not None and t.compacted

    def append(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Ack:
        """Append one record now and return where it went (what a producer's send does)."""
        return self.append_one(topic, value, key, headers, partition, timestamp_ms)

    def messages(self, topic: str, partition: int) -> list[Message]:
        """The records ``topic[partition]`` still holds, oldest first."""
        return list(self.log(TopicPartition(topic, partition)).messages)

    def offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """The log start offset and the high watermark (next offset) of ``tp``."""
        log = self.log(tp)
        return log.base, log.end

    def committed(self, group_id: str, tp: TopicPartition) -> int | None:
        """The offset ``group_id`` committed for ``tp``, or None."""
        group = self._groups.get(group_id)
        return None if group is None else group.committed.get(tp)

    # -- the clients' side: what the broker's consumers and producers call ----------------

    def _topic(self, name: str) -> _Topic:
        t = self._topics.get(name)
        if t is None:
            self.create_topic(name, self.default_partitions)
            t = self._topics[name]
        return t

    def log(self, tp: TopicPartition) -> _Log:
        """The log of ``tp``; an unknown partition raises ``TransportError``."""
        t = self._topics.get(tp.topic)
        if t is None or not 0 <= tp.partition < len(t.logs):
            raise TransportError(f"unknown partition {tp.topic}[{tp.partition}]")
        return t.logs[tp.partition]

    def append_one(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
        timestamp_ms: int | None,
    ) -> _DoneAck:
        """``append`` with positional arguments: a producer's send, one call less."""
        t = self._topics.get(topic) or self._topic(topic)
        logs = t.logs
        if partition is None:
            if key is None:
                # Round-robin: keyless records spread evenly, so every partition gets work.
                partition = t.next_partition
                t.next_partition = (partition + 1) % len(logs)
            else:
                cached = t.key_partitions.get(key)
                if cached is None:
                    if len(t.key_partitions) >= _KEY_CACHE_SIZE:
                        t.key_partitions.clear()
                    cached = t.key_partitions[key] = partition_for_key(key, len(logs))
                partition = cached
        ack = self.append_batch(topic, partition, ((key, value, headers, timestamp_ms),))
        assert ack is not None  # one record appended
        return ack

    def append_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> _DoneAck | None:
        """Append ``records`` to one partition, as one producer batch; the ack of the last.

        A router's outputs arrive here by the thousand: one call, one clock reading, one
        trim check and one wake-up per batch, not per record.
        """
        t = self._topics.get(topic) or self._topic(topic)
        logs = t.logs
        if not 0 <= partition < len(logs):
            raise TransportError(
                f"topic {topic!r} has no partition {partition} (it has {len(logs)})"
            )
        if not records:
            return None
        log = logs[partition]
        messages = log.messages
        first = offset = log.next_offset
        now: int | None = None
        append = messages.append
        for key, value, headers, timestamp_ms in records:
            if timestamp_ms is None:
                if now is None:
                    now = int(self._clock() * 1000)
                timestamp_ms = now
            append(Message(topic, partition, offset, timestamp_ms, key, value, headers))
            offset += 1
        log.next_offset = offset
        if len(messages) > log.trim_at:
            if t.compacted:
                log.compact()
                log.trim_at = max(2 * len(log.messages), _COMPACT_AT)
            else:
                self._trim(TopicPartition(topic, partition), log)
        if log.waiters:
            _wake(log.waiters)
        return _done_ack(topic, partition, offset - 1) if offset > first else None

    def _trim(self, tp: TopicPartition, log: _Log) -> None:
        assert self.retention_records is not None
        floor: int | None = None
        for group in self._groups.values():
            offset = group.committed.get(tp)
            if offset is not None and (floor is None or offset < floor):
                floor = offset
        if floor is not None:
            drop = log.index(min(floor, log.end - self.retention_records))
            if drop > 0:
                del log.messages[:drop]
                log.base = log.messages[0].offset if log.messages else log.end
        # Whether or not anything went, look again only after another chunk of appends.
        log.trim_at = len(log.messages) + self._slack

    def group(self, group_id: str) -> _Group:
        """The consumer group ``group_id`` (made on first use)."""
        return self._groups.setdefault(group_id, _Group())

    def join(self, group_id: str, member: MemoryConsumer, topics: tuple[str, ...]) -> None:
        """``member`` joins ``group_id`` reading ``topics``: the group rebalances."""
        for name in topics:
            self._topic(name)
        self.group(group_id).members[member] = topics
        self._rebalance(group_id)

    def leave(self, group_id: str, member: MemoryConsumer) -> None:
        """``member`` leaves ``group_id``: its partitions go to the others."""
        group = self.group(group_id)
        group.members.pop(member, None)
        for tp in [tp for tp, m in group.holders.items() if m is member]:
            del group.holders[tp]
        self._rebalance(group_id)

    def _rebalance(self, group_id: str) -> None:
        """Range assignment per topic over the members in join order, as Kafka's
        RangeAssignor does over sorted member ids: co-partitioned topics line up."""
        group = self.group(group_id)
        targets: dict[MemoryConsumer, set[TopicPartition]] = {m: set() for m in group.members}
        by_topic: dict[str, list[MemoryConsumer]] = {}
        for member, topics in group.members.items():
            for name in topics:
                by_topic.setdefault(name, []).append(member)
        for name, members in by_topic.items():
            per, extra = divmod(len(self._topics[name].logs), len(members))
            start = 0
            for i, member in enumerate(members):
                count = per + (i < extra)
                targets[member].update(TopicPartition(name, p) for p in range(start, start + count))
                start += count
        group.targets = targets
        for member in group.members:
            member.poke(rebalance=True)

    def next_member_id(self, client_id: str) -> str:
        """A member id for a new consumer, unique in this broker."""
        self._member_seq += 1
        return f"{client_id}-{self._member_seq}"
