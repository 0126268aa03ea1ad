"""A checkpoint cancelled while it waits for the broker's acks (the worker stops, a forced
stop cancels its tasks) leaves the sends alone: the next checkpoint awaits them all and
finds every record stored. Awaiting a Kafka client's delivery future directly would cancel
it with the waiting task, and the final checkpoint would fail on it.

On Tansu and Apache Kafka, both clients; the memory broker's acks are stored at once (the
same waits with held acks: tests/runtime/test_publisher_cancel.py).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from flowkit.runtime.output.publisher import Publisher
from flowkit.transports import MemoryTransport

from .conftest import TransportFactory, collect
from .test_conformance import new_topic, reader

PARTITIONS = 2


async def test_a_checkpoint_cancelled_while_it_waits_leaves_its_sends_to_the_next(
    transport_factory: TransportFactory,
) -> None:
    transport = transport_factory()
    if isinstance(transport, MemoryTransport):
        pytest.skip("the memory broker acknowledges each send at once: nothing to wait for")
    topic = await new_topic(transport, PARTITIONS)

    async def partitions(name: str) -> int:
        return PARTITIONS

    producer = transport.producer()
    await producer.start()
    publisher = Publisher(producer, partition_count=partitions)
    calls: list[bool] = []
    for round_ in range(3):  # a few broker batches per partition
        for i in range(20):
            n = round_ * 20 + i
            publisher.publish(topic, f"v{n}".encode(), f"k{n}".encode(), (), None)
        await publisher.flush()
    publisher.when_acknowledged(calls.append)  # a latency watch, stopped below
    waiting = asyncio.create_task(publisher.await_acks())
    await asyncio.sleep(0)
    assert not waiting.done()  # the broker has not answered yet: it waits
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    publisher.stop_watching()

    await publisher.await_acks()  # the final checkpoint
    consumer = reader(transport, topic, PARTITIONS)
    await consumer.start()
    got = await collect(consumer, 60)
    assert sorted(m.value for m in got if m.value) == sorted(f"v{n}".encode() for n in range(60))
    ends = {(m.topic, m.partition): m.offset + 1 for m in got}
    assert publisher.sent_end == ends
    assert publisher.all_acked()
    await producer.aclose()


async def test_a_waiter_cancelled_on_a_send_leaves_the_send_to_the_checkpoint(
    transport_factory: TransportFactory,
) -> None:
    """``topic.send()`` hands its ack to the agent: the agent cancelled while it waits
    (the worker stops its agents) must not cancel the send itself, which the final
    checkpoint reads (a cancelled delivery future made it fail, and a graceful stop exit
    with status 1)."""
    transport = transport_factory()
    if isinstance(transport, MemoryTransport):
        pytest.skip("the memory broker acknowledges each send at once: nothing to wait for")
    topic = await new_topic(transport, PARTITIONS)

    async def partitions(name: str) -> int:
        return PARTITIONS

    producer = transport.producer()
    await producer.start()
    publisher = Publisher(producer, partition_count=partitions)
    waiters = []
    for n in range(20):
        ack = await publisher.send_bytes(topic, f"s{n}".encode(), key=f"k{n}".encode())
        waiters.append(asyncio.ensure_future(ack))  # as an agent awaits its send
    for n in range(20, 40):
        publisher.publish(topic, f"s{n}".encode(), f"k{n}".encode(), (), None)
    await publisher.flush()
    await asyncio.sleep(0)
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)

    await publisher.await_acks()  # the final checkpoint
    consumer = reader(transport, topic, PARTITIONS)
    await consumer.start()
    got = await collect(consumer, 40)
    assert sorted(m.value for m in got if m.value) == sorted(f"s{n}".encode() for n in range(40))
    assert publisher.all_acked()
    await producer.aclose()
