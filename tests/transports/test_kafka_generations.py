"""aiokafka's transactions with the consumer group's generation, on Apache Kafka
(flowkit.transports.kafka.generations): the group coordinator refuses the offsets of a
member whose generation is gone, and a member asking for its committed offsets waits while
a transaction holds offsets not committed yet (KIP-447, as the Java client and librdkafka).

The end-to-end case (a worker paused past its session while another takes over) is
tests/kafka/test_exactly_once.py's zombie test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka.structs import TopicPartition as KafkaTP

from flowkit.errors import CommitFailed, TransactionAborted
from flowkit.records import TopicPartition
from flowkit.transports import TopicSpec
from flowkit.transports.kafka import KafkaConsumer, KafkaTransport
from flowkit.transports.kafka.generations import send_offsets
from tests.apache_kafka import ApacheKafka

pytestmark = [pytest.mark.kafka, pytest.mark.apache_kafka]


class _Quiet:
    async def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        pass

    async def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        pass


@pytest.fixture
async def transport(apache_kafka: ApacheKafka) -> AsyncIterator[KafkaTransport]:
    t = KafkaTransport([apache_kafka.bootstrap])
    try:
        yield t
    finally:
        await t.aclose()


async def member(transport: KafkaTransport, topic: str, group: str) -> KafkaConsumer:
    """A consumer of ``group`` that has joined it and been given ``topic``'s partition."""
    consumer = transport.consumer(group_id=group)
    consumer.subscribe([topic], _Quiet())
    async with asyncio.timeout(30):
        while not consumer.assignment():
            await consumer.getmany(0.1, 10)
    return consumer


async def test_offsets_of_a_generation_the_group_left_are_refused(
    transport: KafkaTransport,
) -> None:
    name = f"gen-{uuid.uuid4().hex[:8]}"
    await transport.create_topics([TopicSpec(f"{name}-in", 1), TopicSpec(f"{name}-out", 1)])
    producer = transport.transactional_producer(transactional_id=name)
    consumer = await member(transport, f"{name}-in", name)
    tp = TopicPartition(f"{name}-in", 0)
    await producer.send(f"{name}-out", b"first")
    await producer.commit_transaction({tp: 5}, consumer)
    assert await consumer.committed(tp) == 5
    # What a member paused through a rebalance still holds: the generation before it.
    assert consumer.generation is not None
    generation, member_id = consumer.generation
    consumer.generation = (generation - 1, member_id)
    await producer.send(f"{name}-out", b"second")
    with pytest.raises(CommitFailed, match="IllegalGenerationError"):  # the broker's answer
        await send_offsets(producer._kafka, consumer.generation, {KafkaTP(tp.topic, 0): 7}, name)
    with pytest.raises(TransactionAborted) as refused:  # and through the worker's producer
        await producer.commit_transaction({tp: 7}, consumer)
    assert refused.value.fenced
    assert await consumer.committed(tp) == 5  # nothing of the refused transactions counts


async def test_committed_offsets_wait_while_a_transaction_holds_new_ones(
    transport: KafkaTransport,
) -> None:
    name = f"gen-{uuid.uuid4().hex[:8]}"
    await transport.create_topics([TopicSpec(f"{name}-in", 1), TopicSpec(f"{name}-out", 1)])
    producer = transport.transactional_producer(transactional_id=name)
    consumer = await member(transport, f"{name}-in", name)
    tp = TopicPartition(f"{name}-in", 0)
    await producer.send(f"{name}-out", b"x")
    kafka = producer._kafka
    assert consumer.generation is not None
    await send_offsets(kafka, consumer.generation, {KafkaTP(tp.topic, 0): 9}, name)
    # The offsets are pending in the open transaction: a fetch of the committed offsets
    # waits for it to end rather than answer with the ones before it.
    asked = asyncio.ensure_future(consumer.committed(tp))
    done, _ = await asyncio.wait([asked], timeout=1.0)
    assert not done
    await kafka.commit_transaction()
    async with asyncio.timeout(30):
        assert await asked == 9


async def test_outputs_alone_of_a_generation_the_group_left_are_refused(
    transport: KafkaTransport,
) -> None:
    # A transaction with no new input offsets (windows closed by time) carries the last
    # commit's offsets again (``fence``), so that the coordinator checks the generation.
    name = f"gen-{uuid.uuid4().hex[:8]}"
    await transport.create_topics([TopicSpec(f"{name}-in", 1), TopicSpec(f"{name}-out", 1)])
    producer = transport.transactional_producer(transactional_id=name)
    consumer = await member(transport, f"{name}-in", name)
    tp = TopicPartition(f"{name}-in", 0)
    await producer.send(f"{name}-out", b"first")
    await producer.commit_transaction({tp: 5}, consumer)
    await producer.send(f"{name}-out", b"closed by time")
    await producer.commit_transaction({}, consumer, fence={tp: 5})  # a member in the group
    assert consumer.generation is not None
    generation, member_id = consumer.generation
    consumer.generation = (generation - 1, member_id)  # a member paused through a rebalance
    await producer.send(f"{name}-out", b"closed by a zombie")
    with pytest.raises(TransactionAborted) as refused:
        await producer.commit_transaction({}, consumer, fence={tp: 5})
    assert refused.value.fenced
    assert await consumer.committed(tp) == 5
