"""What every transport must do, written only against the ``Transport`` protocol.

Run on the memory broker, on Tansu and on Apache Kafka, each Kafka with both clients
(tests/transports/conftest.py). Kept runnable on Tansu: no ``end_offsets``, no
``auto_offset_reset="latest"``, no compaction, no reliance on auto-created partition counts,
and polling with deadlines.
"""

from __future__ import annotations

import pytest

from flowkit.errors import ConfigurationError, RecordRejected
from flowkit.partitioning import partition_for_key
from flowkit.records import Message, TopicPartition
from flowkit.transports import Ack, Consumer, MemoryTransport, TopicSpec, Transport

from .conftest import Recorder, TransportFactory, collect, poll, unique


async def new_topic(transport: Transport, partitions: int) -> str:
    name = unique("conf")
    await transport.create_topics([TopicSpec(name, partitions)])
    return name


def reader(transport: Transport, topic: str, partitions: int) -> Consumer:
    consumer = transport.consumer(group_id=None, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    return consumer


async def test_create_topics_and_partition_count(transport_factory: TransportFactory) -> None:
    transport = transport_factory()
    a, b = unique("conf"), unique("conf")
    await transport.create_topics([TopicSpec(a, 3), TopicSpec(b, 1)])
    assert await transport.partition_count(a) == 3
    assert await transport.partition_count(b) == 1
    await transport.create_topics([TopicSpec(a, 3)])  # existing, same count: fine
    assert await transport.partition_count(a) == 3


async def test_create_topics_with_another_partition_count_raises(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 2)
    with pytest.raises(ConfigurationError, match=topic):
        await transport.create_topics([TopicSpec(topic, 3)])


async def test_timestamp_bounds_are_read_from_the_topic(
    transport_factory: TransportFactory,
) -> None:
    """What a topic takes, as the publisher checks a ``topic.send(timestamp_ms=)`` before
    sending it; a topic flowkit makes for itself takes any timestamp."""
    transport = transport_factory()
    bounded, internal = unique("conf"), unique("conf")
    config = {"message.timestamp.after.max.ms": "60000", "message.timestamp.before.max.ms": "7"}
    await transport.create_topics(
        [TopicSpec(bounded, 1, config=config), TopicSpec(internal, 1, internal=True)]
    )
    if isinstance(transport, MemoryTransport):
        assert await transport.timestamp_bounds(bounded) == (None, None)  # takes any
        return
    assert await transport.timestamp_bounds(bounded) == (60_000, 7)
    assert await transport.timestamp_bounds(internal) == (None, None)
    assert await transport.timestamp_bounds(unique("missing")) == (None, None)


async def test_keyed_records_land_on_the_murmur2_partition(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 4)
    producer = transport.producer()
    await producer.start()
    keys = [f"key-{i}".encode() for i in range(40)]
    acks = [await (await producer.send(topic, b"v", key=key)) for key in keys]
    await producer.flush()
    for key, ack in zip(keys, acks, strict=True):
        assert ack.topic == topic
        assert ack.partition == partition_for_key(key, 4)
    consumer = reader(transport, topic, 4)
    await consumer.start()
    got = await collect(consumer, len(keys))
    assert len(got) == len(keys)
    for message in got:
        assert message.key is not None
        assert message.partition == partition_for_key(message.key, 4)
    assert sorted(m.key for m in got if m.key) == sorted(keys)


async def test_keyless_records_spread_over_partitions(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 4)
    producer = transport.producer()
    await producer.start()
    acks: list[Ack] = [await (await producer.send(topic, b"%d" % i)) for i in range(40)]
    assert len({ack.partition for ack in acks}) > 1
    assert all(0 <= ack.partition < 4 for ack in acks)


async def test_headers_none_values_and_timestamps_round_trip(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    producer = transport.producer()
    await producer.start()
    headers = (("trace", b"abc"), ("empty", b""), ("trace", b"def"))
    await producer.send(topic, b"one", key=b"k1", headers=headers, timestamp_ms=1_700_000_000_123)
    await producer.send(topic, None, key=b"k2", timestamp_ms=1_700_000_000_456)
    await producer.send(topic, b"three", partition=0, timestamp_ms=1_700_000_000_789)
    await producer.flush()
    got = await collect(reader(transport, topic, 1), 3)
    assert [(m.key, m.value, m.timestamp) for m in got] == [
        (b"k1", b"one", 1_700_000_000_123),
        (b"k2", None, 1_700_000_000_456),
        (None, b"three", 1_700_000_000_789),
    ]
    assert tuple(got[0].headers) == headers
    assert tuple(got[1].headers) == ()
    assert [m.offset for m in got] == [0, 1, 2]
    assert all(isinstance(m, Message) and m.topic == topic and m.partition == 0 for m in got)


async def test_a_null_header_value_round_trips_and_can_be_sent_again(
    transport_factory: TransportFactory,
) -> None:
    """Kafka allows a header whose value is null (a dead letter re-sends it)."""
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    producer = transport.producer()
    await producer.start()
    headers = (("x", None), ("y", b""), ("x", b"v"))
    await producer.send(topic, b"{", key=b"k", headers=headers, timestamp_ms=1_700_000_000_000)
    await producer.flush()
    (got,) = await collect(reader(transport, topic, 1), 1)
    assert tuple(got.headers) == headers
    # What a dead letter does: send the record's own headers again.
    await (await producer.send(topic, got.value, key=got.key, headers=got.headers))
    await producer.flush()


async def test_a_record_over_max_record_bytes_is_rejected_and_the_producer_goes_on(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    producer = transport.producer()
    await producer.start()
    limit = producer.max_record_bytes
    assert limit is not None
    # Apache Kafka refuses records over 1 MiB by default (message.max.bytes), whatever the
    # producer allows; a topic may raise its own limit, as this one does. (Tansu has none.)
    topic = unique("conf")
    config = {"max.message.bytes": str(limit + 65536)}
    await transport.create_topics([TopicSpec(topic, 1, config=config)])
    with pytest.raises(RecordRejected, match=r"(?i)too ?large|over max_record_bytes"):
        # (A producer may count a little framing on top: 2 KiB over is over for any.)
        await producer.send(topic, b"x" * (limit + 2048), key=b"k", headers=(("h", b"v"),))
    fits = b"y" * (limit - 100)
    await (await producer.send(topic, fits, key=b"k"))
    got = await collect(reader(transport, topic, 1), 1)
    assert [(m.offset, m.value) for m in got] == [(0, fits)]


async def test_send_batch_keeps_the_order_and_acks_each_broker_batch_at_its_last_record(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 2)
    producer = transport.producer()
    await producer.start()
    # About 600 kB: more than one broker batch on Kafka (max_batch_size is 256 KiB).
    records = [
        (b"k%d" % i, b"%06d" % i + b"." * 294, (("n", b"%d" % i),) if i % 2 else (), 1_000 + i)
        for i in range(2_000)
    ]
    sent = await producer.send_batch(topic, 1, records)
    assert sum(n for n, _ in sent) == len(records)
    end = 0
    for n, pending in sent:
        ack = await pending
        assert (ack.topic, ack.partition, ack.offset) == (topic, 1, end + n - 1)
        end += n
    got = await collect(reader(transport, topic, 2), len(records))
    assert [(m.partition, m.offset) for m in got] == [(1, i) for i in range(len(records))]
    assert [(m.key, m.value, tuple(m.headers), m.timestamp) for m in got] == records


async def test_getmany_is_in_offset_order_and_respects_max_records(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 2)
    producer = transport.producer()
    for i in range(30):
        await producer.send(topic, b"%d" % i, partition=i % 2)
    await producer.flush()
    consumer = reader(transport, topic, 2)
    seen: dict[int, list[int]] = {0: [], 1: []}
    total = 0
    for _ in range(400):
        batch = await consumer.getmany(timeout=0.05, max_records=4)
        assert sum(len(ms) for ms in batch.values()) <= 4
        for tp, messages in batch.items():
            assert all(m.partition == tp.partition and m.topic == topic for m in messages)
            seen[tp.partition].extend(m.offset for m in messages)
            total += len(messages)
        if total == 30:
            break
    assert seen == {0: list(range(15)), 1: list(range(15))}


async def test_new_group_starts_at_earliest(transport_factory: TransportFactory) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    producer = transport.producer()
    for i in range(5):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    consumer = transport.consumer(group_id=unique("g"), auto_offset_reset="earliest")
    consumer.subscribe([topic], Recorder("c", []))
    assert [m.offset for m in await collect(consumer, 5)] == [0, 1, 2, 3, 4]


async def test_a_new_member_resumes_at_the_committed_offset(
    transport_factory: TransportFactory,
) -> None:
    group, topic = unique("g"), await new_topic(transport_factory(), 1)
    tp = TopicPartition(topic, 0)
    first = transport_factory()
    producer = first.producer()
    for i in range(10):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    consumer = first.consumer(group_id=group)
    consumer.subscribe([topic], Recorder("first", []))
    got = await collect(consumer, 10)
    assert [m.offset for m in got] == list(range(10))
    await consumer.commit({tp: 7})  # as if records 7..9 were not done yet
    await consumer.aclose()
    await first.aclose()

    second = transport_factory()  # a restarted worker on the same broker
    producer = second.producer()
    for i in range(10, 13):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    resumed = second.consumer(group_id=group)
    resumed.subscribe([topic], Recorder("second", []))
    got = await collect(resumed, 6)
    assert [m.offset for m in got] == list(range(7, 13))


async def test_position_follows_the_records_returned(transport_factory: TransportFactory) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    tp = TopicPartition(topic, 0)
    producer = transport.producer()
    for i in range(10):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    consumer = reader(transport, topic, 1)
    assert consumer.assignment() == {tp}
    assert [m.offset for m in await collect(consumer, 10)] == list(range(10))
    assert consumer.position(tp) == 10
    for i in range(10, 16):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    got = await collect(consumer, 6)
    assert [m.offset for m in got] == list(range(10, 16))
    assert [m.value for m in got] == [b"%d" % i for i in range(10, 16)]
    assert consumer.position(tp) == 16


async def test_highwater_after_a_fetch(transport_factory: TransportFactory) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    tp = TopicPartition(topic, 0)
    consumer = reader(transport, topic, 1)
    assert consumer.highwater(tp) is None
    producer = transport.producer()
    for i in range(8):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    await collect(consumer, 8)
    assert consumer.highwater(tp) == 8


async def test_seek_reads_from_the_offset(transport_factory: TransportFactory) -> None:
    # Table recovery seeks to the offset its local state reflects. (Past the end, brokers
    # differ: Tansu does not reset; recovery does not rely on a reset.)
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    tp = TopicPartition(topic, 0)
    producer = transport.producer()
    await producer.start()
    for i in range(10):
        await producer.send(topic, b"%d" % i)
    await producer.flush()
    consumer = reader(transport, topic, 1)
    await consumer.start()
    consumer.seek(tp, 6)
    assert [m.offset for m in await collect(consumer, 4)] == [6, 7, 8, 9]
    consumer.seek(tp, 2)
    assert [m.offset for m in await collect(consumer, 8)] == list(range(2, 10))
    await consumer.aclose()


async def test_assign_again_keeps_the_position_of_kept_partitions(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    topic = await new_topic(transport, 2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    producer = transport.producer()
    for i in range(10):
        await producer.send(topic, b"%d" % i, partition=i % 2)
    await producer.flush()
    consumer = reader(transport, topic, 1)
    got = await collect(consumer, 5)
    assert {m.partition for m in got} == {0}
    consumer.assign([tp0, tp1])
    assert consumer.assignment() == {tp0, tp1}
    got = await collect(consumer, 5)
    assert [(m.partition, m.offset) for m in got] == [(1, i) for i in range(5)]
    for _ in range(3):  # tp0 was not read again from its start
        assert await consumer.getmany(timeout=0.05, max_records=100) == {}
    assert consumer.position(tp0) == consumer.position(tp1) == 5


async def test_two_members_split_the_partitions_and_hand_them_over(
    transport_factory: TransportFactory,
) -> None:
    group, topic = unique("g"), await new_topic(transport_factory(), 4)
    every = {TopicPartition(topic, p) for p in range(4)}
    events: list[tuple[str, str, TopicPartition]] = []
    a, b = Recorder("a", events), Recorder("b", events)
    ca = transport_factory().consumer(group_id=group, client_id="a")
    cb = transport_factory().consumer(group_id=group, client_id="b")
    a.consumer, b.consumer = ca, cb
    await ca.start()
    ca.subscribe([topic], a)
    await poll([ca], lambda: a.owned == every)
    await cb.start()
    cb.subscribe([topic], b)
    await poll([ca, cb], lambda: bool(a.owned and b.owned) and a.owned | b.owned == every)
    assert not a.owned & b.owned
    assert ca.assignment() == a.owned and cb.assignment() == b.owned

    producer = transport_factory().producer()
    for i in range(40):
        await producer.send(topic, b"%d" % i, key=b"k%d" % i)
    await producer.flush()
    got: dict[Consumer, list[Message]] = {}
    await poll([ca, cb], lambda: sum(map(len, got.values())) >= 40, got)
    assert {(m.partition, m.offset) for m in got[ca]}.isdisjoint(
        (m.partition, m.offset) for m in got[cb]
    )
    assert {TopicPartition(topic, m.partition) for m in got[ca]} <= a.owned
    assert {TopicPartition(topic, m.partition) for m in got[cb]} <= b.owned

    # b commits what it read and leaves; a takes over from b's commits.
    await cb.commit({tp: cb.position(tp) for tp in b.owned})
    events.extend(("closed", "b", tp) for tp in sorted(b.owned))
    b.owned = set()
    await cb.aclose()
    await poll([ca], lambda: a.owned == every)
    for i in range(40, 60):
        await producer.send(topic, b"%d" % i, key=b"k%d" % i)
    await producer.flush()
    await poll([ca], lambda: sum(map(len, got.values())) >= 60, got)
    everything = [(m.partition, m.offset) for ms in got.values() for m in ms]
    assert len(everything) == len(set(everything)) == 60  # every record exactly once
    assert sorted(int(m.value or b"") for ms in got.values() for m in ms) == list(range(60))

    # A partition is assigned only when no one else holds it: revoke/close comes first.
    holder: dict[TopicPartition, str] = {}
    for kind, name, tp in events:
        if kind == "assigned":
            assert tp not in holder, f"{tp} assigned to {name} while {holder.get(tp)} held it"
            holder[tp] = name
        else:
            assert holder.pop(tp) == name


def _transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["transport_factory"])


async def test_timestamps_0_and_minus_1_as_each_producer_writes_them(
    transport_factory: TransportFactory, request: pytest.FixtureRequest
) -> None:
    """Kafka keeps a CreateTime of 0, and -1 means "no timestamp". librdkafka cannot write
    0: to it, 0 means "now", so it writes the current time (a quirk of that client, which
    docs/kafka.md names); every other transport writes both as they are."""
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    producer = transport.producer()
    await producer.start()
    for ts in (0, -1):
        await (await producer.send(topic, b"%d" % ts, key=b"k", timestamp_ms=ts))
    got = await collect(reader(transport, topic, 1), 2)
    zero, minus_one = (m.timestamp for m in got)
    assert minus_one == -1
    if _transport_kind(request).endswith("rdkafka"):
        assert zero > 1_700_000_000_000  # the wall clock's
    else:
        assert zero == 0


async def test_a_header_name_with_a_nul(
    transport_factory: TransportFactory, request: pytest.FixtureRequest
) -> None:
    """A header name is any string to Kafka; librdkafka's C API ends it at a NUL, so that
    client writes (and reads) only the part before it."""
    transport = transport_factory()
    topic = await new_topic(transport, 1)
    producer = transport.producer()
    await producer.start()
    await producer.send(topic, b"v", headers=(("a\x00b", b"1"), ("c", b"2")))
    await producer.flush()
    (got,) = await collect(reader(transport, topic, 1), 1)
    cut = _transport_kind(request).endswith("rdkafka")
    assert tuple(got.headers) == ((("a" if cut else "a\x00b"), b"1"), ("c", b"2"))
