"""Behaviour of the embedded broker beyond the transport protocol."""

from __future__ import annotations

import asyncio
import time

import pytest

from flowkit.errors import CommitFailed, ConfigurationError, TransportError
from flowkit.records import Message, TopicPartition
from flowkit.transports import (
    Ack,
    Consumer,
    MemoryBroker,
    MemoryTransport,
    TopicSpec,
    transport_from_url,
)
from flowkit.transports.memory import MemoryConsumer

from .conftest import Recorder, collect, poll

TP = TopicPartition("t", 0)


def fill(broker: MemoryBroker, count: int, topic: str = "t", partition: int = 0) -> None:
    for i in range(count):
        broker.append(topic, b"%d" % i, partition=partition)


def member(transport: MemoryTransport, group: str, topics: list[str], name: str) -> Recorder:
    recorder = Recorder(name, [])
    consumer = transport.consumer(group_id=group, client_id=name)
    recorder.consumer = consumer
    consumer.subscribe(topics, recorder)
    return recorder


def consumer_of(recorder: Recorder) -> MemoryConsumer:
    assert isinstance(recorder.consumer, MemoryConsumer)
    return recorder.consumer


def owned(recorder: Recorder) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tp in sorted(recorder.owned):
        out.setdefault(tp.topic, []).append(tp.partition)
    return out


# -- topics, producing ------------------------------------------------------------------


async def test_unknown_topics_are_created_on_produce_and_subscribe() -> None:
    transport = MemoryTransport(MemoryBroker(default_partitions=3))
    assert await transport.partition_count("new") is None
    await transport.producer().send("new", b"v")
    assert await transport.partition_count("new") == 3
    transport.consumer(group_id="g").subscribe(["other"], Recorder("c", []))
    assert await transport.partition_count("other") == 3
    assert MemoryBroker().partition_count("x") is None
    MemoryBroker().append("x", b"v")  # default_partitions=1, as Kafka's num.partitions


async def test_create_topics_stores_compacted_and_is_all_or_nothing() -> None:
    transport = MemoryTransport()
    await transport.create_topics([TopicSpec("log", 2, compacted=True), TopicSpec("plain", 1)])
    assert transport.broker.is_compacted("log")
    assert not transport.broker.is_compacted("plain")
    with pytest.raises(ConfigurationError, match="'plain' exists with 1 partition, not 4"):
        await transport.create_topics([TopicSpec("fresh", 1), TopicSpec("plain", 4)])
    assert await transport.partition_count("fresh") is None
    with pytest.raises(ConfigurationError):
        await transport.create_topics([TopicSpec("zero", 0)])


async def test_ack_is_an_already_done_awaitable_equal_to_a_plain_ack() -> None:
    producer = MemoryTransport().producer()
    sent = await producer.send("t", b"v", key=b"k")
    ack = await sent
    assert isinstance(ack, Ack)
    assert ack == Ack("t", 0, 0) and Ack("t", 0, 0) == ack
    assert hash(ack) == hash(Ack("t", 0, 0))
    assert repr(ack) == "Ack(topic='t', partition=0, offset=0)"
    assert ack != object()


async def test_explicit_partition_wins_and_is_checked() -> None:
    broker = MemoryBroker(default_partitions=4)
    assert broker.append("t", b"v", key=b"foobar", partition=3).partition == 3
    with pytest.raises(TransportError, match="no partition 4"):
        broker.append("t", b"v", partition=4)


async def test_keyless_records_round_robin() -> None:
    broker = MemoryBroker(default_partitions=3)
    assert [broker.append("t", None).partition for _ in range(6)] == [0, 1, 2, 0, 1, 2]


async def test_timestamps_come_from_the_clock() -> None:
    broker = MemoryBroker(clock=lambda: 1234.5678)
    broker.append("t", b"v")
    broker.append("t", b"v", timestamp_ms=7)
    assert [m.timestamp for m in broker.messages("t", 0)] == [1234567, 7]


async def test_closed_producer_refuses_to_send() -> None:
    producer = MemoryTransport().producer()
    await producer.start()
    await producer.aclose()
    await producer.aclose()
    with pytest.raises(TransportError, match="closed"):
        await producer.send("t", b"v")
    with pytest.raises(TransportError):
        await producer.start()


# -- retention --------------------------------------------------------------------------


async def test_nothing_is_dropped_until_a_group_commits() -> None:
    broker = MemoryBroker(retention_records=10)
    fill(broker, 100)
    assert broker.offsets(TP) == (0, 100)


async def test_retention_drops_only_what_every_group_committed() -> None:
    broker = MemoryBroker(retention_records=10)
    transport = MemoryTransport(broker)
    fast, slow = member(transport, "fast", ["t"], "f"), member(transport, "slow", ["t"], "s")
    fill(broker, 100)
    for recorder in (fast, slow):
        await collect(consumer_of(recorder), 100)
    await consumer_of(fast).commit({TP: 90})
    await consumer_of(slow).commit({TP: 40})
    fill(broker, 20)
    start, end = broker.offsets(TP)
    assert end == 120
    assert 30 <= start <= 40  # the slowest group holds the log; trimmed in chunks
    await consumer_of(slow).commit({TP: 120})
    fill(broker, 200)
    assert broker.offsets(TP) == (90, 320)  # now the fast group holds it
    for recorder in (fast, slow):
        await collect(consumer_of(recorder), 200)
        await consumer_of(recorder).commit({TP: 320})
    fill(broker, 100)
    assert broker.offsets(TP) == (320, 420)  # never past what a group still needs
    for _ in range(50):  # groups that keep up keep the log bounded
        for recorder in (fast, slow):
            consumer = consumer_of(recorder)
            await collect(consumer, broker.offsets(TP)[1] - consumer.position(TP))
            await consumer.commit({TP: consumer.position(TP)})
        fill(broker, 3)
        start, end = broker.offsets(TP)
        assert end - start <= 10 + 10 // 4 + 3  # retention, one chunk, the new records
    assert broker.offsets(TP)[1] == 570
    assert [m.offset for m in broker.messages("t", 0)] == list(range(start, end))


async def test_compacted_topics_and_unbounded_brokers_keep_everything() -> None:
    broker = MemoryBroker(retention_records=5)
    broker.create_topic("c", 1, compacted=True)
    consumer = MemoryTransport(broker).consumer(group_id="g")
    consumer.subscribe(["c"], Recorder("c", []))
    fill(broker, 50, topic="c")
    await collect(consumer, 50)
    await consumer.commit({TopicPartition("c", 0): 50})
    fill(broker, 50, topic="c")
    assert broker.offsets(TopicPartition("c", 0)) == (0, 100)
    unbounded = MemoryBroker(retention_records=None)
    fill(unbounded, 50)
    assert unbounded.offsets(TP) == (0, 50)


async def test_a_reader_below_the_log_start_resets() -> None:
    broker = MemoryBroker(retention_records=4)
    transport = MemoryTransport(broker)
    group = member(transport, "g", ["t"], "g")
    fill(broker, 10)
    await collect(consumer_of(group), 10)
    await consumer_of(group).commit({TP: 10})
    lagging = transport.consumer(group_id=None)
    lagging.assign([TP])
    assert lagging.position(TP) == 0
    fill(broker, 20)
    start, _ = broker.offsets(TP)
    assert start > 0
    got = await collect(lagging, 30 - start)
    assert got[0].offset == start
    latest = transport.consumer(group_id=None, auto_offset_reset="latest")
    latest.assign([TP])
    assert latest.position(TP) == 30
    fill(broker, 20)
    await collect(consumer_of(group), 40)
    await consumer_of(group).commit({TP: 50})
    fill(broker, 10)  # the group committed 50: the log is trimmed past 30, where latest is
    start, end = broker.offsets(TP)
    assert start > 30
    assert latest.position(TP) == end  # below the log start: reset to latest
    assert await latest.getmany(timeout=0, max_records=10) == {}


# -- fetching ---------------------------------------------------------------------------


async def test_getmany_wakes_promptly_when_a_producer_appends() -> None:
    transport = MemoryTransport()
    consumer = transport.consumer(group_id=None)
    transport.broker.append("t", b"first")
    consumer.assign([TP])
    await collect(consumer, 1)
    task = asyncio.create_task(consumer.getmany(timeout=60, max_records=10))
    await asyncio.sleep(0.01)
    assert not task.done()
    await transport.producer().send("t", b"second")
    batch = await asyncio.wait_for(task, 10)  # woken by the send, not by its 60 s timeout
    assert [m.value for m in batch[TP]] == [b"second"]


async def test_getmany_times_out_with_nothing() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    consumer = MemoryTransport(broker).consumer(group_id=None)
    assert await consumer.getmany(timeout=0.01, max_records=1) == {}
    consumer.assign([TP])
    started = time.monotonic()
    assert await consumer.getmany(timeout=0.05, max_records=1) == {}
    assert time.monotonic() - started >= 0.04


async def test_getmany_spreads_max_records_without_starving_partitions() -> None:
    broker = MemoryBroker(default_partitions=4)
    for p in range(4):
        fill(broker, 100, partition=p)
    consumer = MemoryTransport(broker).consumer(group_id=None)
    consumer.assign([TopicPartition("t", p) for p in range(4)])
    batch = await consumer.getmany(timeout=0, max_records=10)
    assert sorted(len(ms) for ms in batch.values()) == [2, 2, 3, 3]
    firsts: list[int] = []
    for _ in range(4):
        one = await consumer.getmany(timeout=0, max_records=1)
        firsts.extend(tp.partition for tp in one)
    assert sorted(firsts) == [0, 1, 2, 3]  # the start rotates
    small = MemoryBroker(default_partitions=2)
    fill(small, 1, partition=0)
    fill(small, 50, partition=1)
    reader = MemoryTransport(small).consumer(group_id=None)
    reader.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    got = await reader.getmany(timeout=0, max_records=20)
    assert {tp.partition: len(ms) for tp, ms in got.items()} == {0: 1, 1: 19}
    with pytest.raises(ValueError):
        await reader.getmany(timeout=0, max_records=0)


async def test_fetch_returns_the_stored_messages_without_copying() -> None:
    broker = MemoryBroker()
    fill(broker, 3)
    consumer = MemoryTransport(broker).consumer(group_id=None)
    consumer.assign([TP])
    batch = await consumer.getmany(timeout=0, max_records=10)
    assert all(a is b for a, b in zip(batch[TP], broker.log(TP).messages, strict=True))


async def test_assign_and_aclose_wake_a_waiting_getmany() -> None:
    broker = MemoryBroker(default_partitions=2)
    fill(broker, 3)
    fill(broker, 2, partition=1)
    consumer = MemoryTransport(broker).consumer(group_id=None)
    consumer.assign([TP])
    await collect(consumer, 3)
    task = asyncio.create_task(consumer.getmany(timeout=5, max_records=10))
    await asyncio.sleep(0.01)
    consumer.assign([TP, TopicPartition("t", 1)])
    assert len((await asyncio.wait_for(task, 1))[TopicPartition("t", 1)]) == 2
    task = asyncio.create_task(consumer.getmany(timeout=5, max_records=10))
    await asyncio.sleep(0.01)
    await consumer.aclose()
    assert await asyncio.wait_for(task, 1) == {}


async def test_unassigned_partitions_are_refused() -> None:
    consumer = MemoryTransport().consumer(group_id=None)
    with pytest.raises(TransportError, match="not assigned"):
        consumer.position(TP)
    with pytest.raises(TransportError, match="unknown partition"):
        consumer.assign([TopicPartition("missing", 0)])
    with pytest.raises(ConfigurationError, match="group_id"):
        consumer.subscribe(["t"], Recorder("c", []))
    with pytest.raises(ConfigurationError):
        MemoryTransport().consumer(group_id="g", auto_offset_reset="middle")  # type: ignore[arg-type]


# -- groups -----------------------------------------------------------------------------


async def test_members_get_range_assignments_in_join_order() -> None:
    broker = MemoryBroker()
    broker.create_topic("a", 6)
    broker.create_topic("b", 6)
    transport = MemoryTransport(broker)
    m1, m2, m3 = (member(transport, "g", ["a", "b"], f"m{i}") for i in (1, 2, 3))
    everyone = [m1, m2, m3]
    await poll([consumer_of(m) for m in everyone], lambda: all(m.owned for m in everyone))
    assert owned(m1) == {"a": [0, 1], "b": [0, 1]}  # co-partitioned topics line up
    assert owned(m2) == {"a": [2, 3], "b": [2, 3]}
    assert owned(m3) == {"a": [4, 5], "b": [4, 5]}
    await consumer_of(m2).aclose()
    survivors = [consumer_of(m1), consumer_of(m3)]
    await poll(survivors, lambda: len(m1.owned) + len(m3.owned) == 12)
    assert owned(m1) == {"a": [0, 1, 2], "b": [0, 1, 2]}
    assert owned(m3) == {"a": [3, 4, 5], "b": [3, 4, 5]}
    assert [e[0] for e in m1.events] == ["assigned"] * 6  # incremental: keeps 0 and 1


async def test_a_partition_moves_only_after_its_owner_releases_it() -> None:
    transport = MemoryTransport(MemoryBroker(default_partitions=2))
    events: list[tuple[str, str, TopicPartition]] = []
    old = Recorder("old", events)
    old.consumer = transport.consumer(group_id="g")
    old.consumer.subscribe(["t"], old)
    await old.consumer.getmany(timeout=0, max_records=1)
    assert len(old.owned) == 2
    new = Recorder("new", events)
    new.consumer = transport.consumer(group_id="g")
    new.consumer.subscribe(["t"], new)
    for _ in range(3):  # the old owner has not polled: nothing to take yet
        await new.consumer.getmany(timeout=0.01, max_records=1)
    assert new.owned == set()
    assert await old.consumer.getmany(timeout=0, max_records=1) == {}
    assert events[-1] == ("revoked", "old", TopicPartition("t", 1))
    await new.consumer.getmany(timeout=0, max_records=1)
    assert new.owned == {TopicPartition("t", 1)}
    with pytest.raises(CommitFailed, match=r"t\[1\]"):
        await old.consumer.commit({TopicPartition("t", 1): 0})


async def test_a_waiting_member_returns_promptly_to_rebalance() -> None:
    transport = MemoryTransport(MemoryBroker(default_partitions=2))
    first = member(transport, "g", ["t"], "first")
    await consumer_of(first).getmany(timeout=0, max_records=1)
    task = asyncio.create_task(consumer_of(first).getmany(timeout=5, max_records=1))
    await asyncio.sleep(0.01)
    second = member(transport, "g", ["t"], "second")
    assert await asyncio.wait_for(task, 1) == {}
    assert first.owned == {TopicPartition("t", 0)}
    assert await consumer_of(second).getmany(timeout=0.01, max_records=1) == {}
    assert second.owned == {TopicPartition("t", 1)}


async def test_revoke_listener_commits_and_the_next_owner_resumes_there() -> None:
    broker = MemoryBroker()
    fill(broker, 10)
    transport = MemoryTransport(broker)
    first = member(transport, "g", ["t"], "first")
    await collect(consumer_of(first), 10)
    second = member(transport, "g2", ["t"], "other-group")
    await collect(consumer_of(second), 10)
    await consumer_of(second).aclose()
    consumer_of(first).subscribe(["u"], first)  # re-subscribing moves t away
    await consumer_of(first).getmany(timeout=0, max_records=1)
    assert broker.committed("g", TP) == 10  # committed by Recorder in on_partitions_revoked
    assert broker.committed("g2", TP) is None


async def test_commit_errors() -> None:
    transport = MemoryTransport()
    with pytest.raises(CommitFailed, match="no group_id"):
        await transport.consumer(group_id=None).commit({TP: 0})
    consumer = transport.consumer(group_id="g")
    with pytest.raises(CommitFailed, match="not assigned"):
        await consumer.commit({TP: 0})
    consumer.subscribe(["t"], Recorder("c", []))
    await consumer.getmany(timeout=0, max_records=1)
    with pytest.raises(CommitFailed, match="negative"):
        await consumer.commit({TP: -1})
    await consumer.commit({TP: 0})
    await consumer.aclose()
    with pytest.raises(CommitFailed, match="closed"):
        await consumer.commit({TP: 0})
    assert transport.broker.committed("g", TP) == 0


async def test_aclose_is_idempotent_and_transport_aclose_leaves_groups() -> None:
    broker = MemoryBroker(default_partitions=2)
    leaving, staying = MemoryTransport(broker), MemoryTransport(broker)
    a, b = member(leaving, "g", ["t"], "a"), member(staying, "g", ["t"], "b")
    await poll([consumer_of(a), consumer_of(b)], lambda: bool(a.owned and b.owned))
    async with leaving:
        pass
    await leaving.aclose()
    await consumer_of(a).aclose()
    with pytest.raises(TransportError, match="closed"):
        await consumer_of(a).getmany(timeout=0, max_records=1)
    with pytest.raises(TransportError, match="closed"):
        leaving.consumer(group_id=None)
    await poll([consumer_of(b)], lambda: len(b.owned) == 2)


async def test_transport_from_url_builds_a_fresh_memory_transport() -> None:
    transport = transport_from_url("memory://")
    assert isinstance(transport, MemoryTransport)
    assert transport.url == "memory://"
    await transport.aclose()


async def test_records_are_processed_once_while_members_come_and_go() -> None:
    broker = MemoryBroker(default_partitions=6, retention_records=50)
    transport = MemoryTransport(broker)
    producer = transport.producer()
    events: list[tuple[str, str, TopicPartition]] = []
    live: list[Recorder] = []
    seen: list[tuple[int, int]] = []

    def join(name: str) -> None:
        recorder = Recorder(name, events)
        recorder.consumer = transport.consumer(group_id="g", client_id=name)
        recorder.consumer.subscribe(["t"], recorder)
        live.append(recorder)

    async def leave(name: str) -> None:
        recorder = next(r for r in live if r.name == name)
        consumer = consumer_of(recorder)
        await consumer.commit({tp: consumer.position(tp) for tp in consumer.assignment()})
        live.remove(recorder)
        await consumer.aclose()

    join("a")
    for step in range(40):
        if step == 5:
            join("b")
        elif step == 10:
            join("c")
        elif step == 20:
            await leave("a")
        elif step == 25:
            join("d")
        elif step == 30:
            await leave("c")
        for i in range(12):
            await producer.send("t", b"%d" % i, key=b"%d-%d" % (step, i))
        batches = await asyncio.gather(
            *(consumer_of(r).getmany(timeout=0.01, max_records=7) for r in live)
        )
        seen.extend((m.partition, m.offset) for b in batches for ms in b.values() for m in ms)
    got: dict[Consumer, list[Message]] = {}
    consumers = [consumer_of(r) for r in live]
    await poll(consumers, lambda: len(seen) + sum(map(len, got.values())) >= 480, got)
    seen.extend((m.partition, m.offset) for ms in got.values() for m in ms)
    assert len(seen) == len(set(seen)) == 480  # every record once, across five rebalances
    starts = [broker.offsets(TopicPartition("t", p))[0] for p in range(6)]
    assert any(starts)  # retention trimmed what the group committed


async def test_compacted_topics_keep_the_newest_record_per_key() -> None:
    broker = MemoryBroker(retention_records=1000)
    transport = MemoryTransport(broker)
    await transport.create_topics([TopicSpec("state", 1, compacted=True)])
    producer = transport.producer()
    for i in range(50_000):
        await producer.send("state", str(i).encode(), key=f"k{i % 10}".encode())
    log = broker._topics["state"].logs[0]
    assert len(log.messages) <= 20_000  # bounded by keys, not by writes
    consumer = transport.consumer(group_id=None)
    consumer.assign([TopicPartition("state", 0)])
    latest: dict[bytes, bytes] = {}
    seen = 0
    while True:
        got = await consumer.getmany(0, 7)  # small fetches cross the gaps
        if not got:
            break
        for message in got[TopicPartition("state", 0)]:
            seen += 1
            assert message.key is not None and message.value is not None
            latest[message.key] = message.value
    assert latest == {f"k{k}".encode(): str(49_990 + k).encode() for k in range(10)}
    assert seen == len(log.messages)
    assert consumer.position(TopicPartition("state", 0)) == 50_000
