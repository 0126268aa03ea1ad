"""Reading partitions to their end (``read_to_end``, ``read_topic``), on every transport.

Like the conformance suite, written against the ``Transport`` protocol only, so it runs on
the memory broker and on Kafka (Tansu).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pytest

from flowkit.errors import ReadStalled, TransportError
from flowkit.records import Message, TopicPartition
from flowkit.transports import Consumer, RebalanceListener, TopicSpec, Transport
from flowkit.transports import read_to_end as exported_read_to_end
from flowkit.transports.reading import read_to_end, read_topic

from .conftest import TransportFactory, unique


class Collector:
    """An ``apply`` that keeps every batch, by partition."""

    def __init__(self) -> None:
        self.batches: list[tuple[TopicPartition, list[Message]]] = []

    def __call__(self, tp: TopicPartition, messages: list[Message]) -> None:
        assert messages, "apply is called with records only"
        self.batches.append((tp, messages))

    def offsets(self) -> dict[TopicPartition, list[int]]:
        out: dict[TopicPartition, list[int]] = {}
        for tp, messages in self.batches:
            assert all(m.topic == tp.topic and m.partition == tp.partition for m in messages)
            out.setdefault(tp, []).extend(m.offset for m in messages)
        return out


async def new_topic(transport: Transport, partitions: int) -> str:
    name = unique("read")
    await transport.create_topics([TopicSpec(name, partitions)])
    return name


async def produce(transport: Transport, topic: str, counts: Mapping[int, int]) -> None:
    """``counts[p]`` records into partition ``p``, acknowledged."""
    producer = transport.producer()
    await producer.start()
    pending = [
        await producer.send(topic, b"%d-%d" % (p, i), key=b"k%d" % i, partition=p)
        for p, n in counts.items()
        for i in range(n)
    ]
    for ack in pending:
        await ack
    await producer.aclose()


async def test_the_transports_package_exports_the_helper() -> None:
    assert exported_read_to_end is read_to_end


async def test_an_empty_topic_reads_nothing(transport_factory: TransportFactory) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 3)
    seen = Collector()
    assert await read_topic(transport, topic, seen, client_id="test-reader") == 0
    assert seen.batches == []


async def test_a_missing_topic_reads_nothing_and_is_not_created(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = unique("missing")
    seen = Collector()
    assert await read_topic(transport, topic, seen, client_id="test-reader") == 0
    assert seen.batches == []
    assert await transport.partition_count(topic) is None


async def test_every_partition_is_read_to_its_end_in_offset_order(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 4)
    counts = {0: 30, 1: 0, 2: 7, 3: 120}
    await produce(transport, topic, counts)
    seen = Collector()
    total = await read_topic(transport, topic, seen, client_id="test-reader")
    assert total == sum(counts.values())
    assert seen.offsets() == {
        TopicPartition(topic, p): list(range(n)) for p, n in counts.items() if n
    }
    values = {m.value for _, ms in seen.batches for m in ms}
    assert values == {b"%d-%d" % (p, i) for p, n in counts.items() for i in range(n)}


_TRANSACTIONAL = [
    pytest.param(broker, marks=[pytest.mark.kafka, pytest.mark.apache_kafka])
    for broker in ("apache-kafka", "apache-rdkafka")
]


@pytest.mark.parametrize("transport_factory", _TRANSACTIONAL, indirect=True)
async def test_a_partition_written_in_transactions_is_read_past_its_markers(
    transport_factory: TransportFactory,
) -> None:
    # Every transaction ends in a marker that takes an offset and is never returned: a
    # reader must count it read, or a changelog written by exactly-once is never read to
    # its end (table recovery stalled on librdkafka).
    transport = transport_factory()
    topic = await new_topic(transport, 2)
    producer = transport.transactional_producer(transactional_id=unique("tx"))
    group = transport.consumer(group_id=unique("g"))  # whose offsets a commit would carry
    await producer.start()
    for n, keep in enumerate((True, False, True)):
        acks = [await producer.send(topic, b"%d-%d" % (n, i), partition=i % 2) for i in range(3)]
        for ack in acks:
            await ack
        if keep:
            await producer.commit_transaction({}, group)
        else:
            await producer.abort_transaction()
    await producer.aclose()
    seen = Collector()
    assert await read_topic(transport, topic, seen, client_id="test-reader") == 6
    values = sorted(m.value for _, ms in seen.batches for m in ms)
    assert values == [b"0-0", b"0-1", b"0-2", b"2-0", b"2-1", b"2-2"]  # read_committed


async def test_read_to_end_reads_only_the_given_partitions(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 3)
    await produce(transport, topic, {0: 5, 1: 6, 2: 7})
    wanted = {TopicPartition(topic, 0), TopicPartition(topic, 2)}
    consumer = transport.consumer(group_id=None, client_id="test-reader")
    await consumer.start()
    try:
        consumer.assign(wanted)
        seen = Collector()
        assert await read_to_end(consumer, wanted, seen) == 12
    finally:
        await consumer.aclose()
    assert seen.offsets() == {
        TopicPartition(topic, 0): list(range(5)),
        TopicPartition(topic, 2): list(range(7)),
    }


class HiddenWatermark:
    """A ``Consumer`` that never reports the high watermark of ``hidden``, as a broker that
    sends no fetch response for an empty partition; everything else goes to ``inner``."""

    def __init__(self, inner: Consumer, hidden: TopicPartition) -> None:
        self.inner = inner
        self.hidden = hidden
        self.polls = 0

    async def start(self) -> None:
        await self.inner.start()

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self.inner.subscribe(topics, listener)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self.inner.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self.inner.assignment()

    async def getmany(
        self, timeout: float, max_records: int
    ) -> dict[TopicPartition, list[Message]]:
        self.polls += 1
        return await self.inner.getmany(timeout, max_records)

    def position(self, tp: TopicPartition) -> int:
        return self.inner.position(tp)

    def highwater(self, tp: TopicPartition) -> int | None:
        return None if tp == self.hidden else self.inner.highwater(tp)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        await self.inner.commit(offsets)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_partition_never_reporting_a_watermark_counts_as_empty(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 3)
    await produce(transport, topic, {0: 4, 1: 9})
    tps = [TopicPartition(topic, p) for p in range(3)]
    consumer = HiddenWatermark(transport.consumer(group_id=None, client_id="test-reader"), tps[2])
    await consumer.start()
    try:
        consumer.assign(tps)
        seen = Collector()
        assert await read_to_end(consumer, tps, seen) == 13
    finally:
        await consumer.aclose()
    assert seen.offsets() == {tps[0]: list(range(4)), tps[1]: list(range(9))}
    assert consumer.polls >= 20  # it waited for the hidden watermark before giving up on it


class Stuck:
    """A ``Consumer`` of one partition whose watermark says 5 but that never returns a
    record: a read that cannot progress."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.polls = 0

    async def start(self) -> None:
        pass

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        raise AssertionError("not used")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    async def getmany(
        self, timeout: float, max_records: int
    ) -> dict[TopicPartition, list[Message]]:
        self.polls += 1
        return {}  # at once: 200 polls take no time

    def position(self, tp: TopicPartition) -> int:
        return 2

    def highwater(self, tp: TopicPartition) -> int | None:
        return 5

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        raise AssertionError("not used")

    async def aclose(self) -> None:
        pass


async def test_a_read_that_makes_no_progress_raises_read_stalled() -> None:
    tp = TopicPartition("stuck", 0)
    consumer = Stuck(tp)
    with pytest.raises(ReadStalled, match=r"stuck\[0\] is at 2 of 5") as raised:
        await read_to_end(consumer, {tp}, Collector())
    assert isinstance(raised.value, TransportError)
    assert consumer.polls == 200
