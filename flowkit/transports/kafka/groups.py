"""A consumer group seen from outside: is anyone in it, where does each log start and end.

For the operator's commands (``flowkit offsets``). The end of a partition is the high
watermark a fetch response reports, never ListOffsets(latest) (aiokafka's
``end_offsets``): some Kafka-compatible brokers answer that wrongly, and the fetch's
watermark is what the broker really holds. A timestamp is turned into offsets with
ListOffsets by time (``offsets_for_times``), which brokers answer from the record
timestamps (Kafka) or, on some compatible brokers, from the time they stored them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiokafka
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition as _KTP

from ...records import TopicPartition
from .errors import map_kafka_errors
from .transport import KafkaTransport

__all__ = ["group_state", "log_ends", "offsets_at"]

_POLL_MS = 50
_POLLS = 40  # about 2 s in all before an unanswered partition is taken as empty


async def group_state(transport: KafkaTransport, group: str) -> str:
    """The group's state as the coordinator reports it: ``Empty`` or ``Dead`` when no
    member is alive, ``Stable`` or ``PreparingRebalance``/``CompletingRebalance`` when
    members are."""
    admin = AIOKafkaAdminClient(**transport.client_options, client_id="flowkit-offsets-admin")
    await transport.connect(admin.start, admin.close)
    try:
        with map_kafka_errors():
            described = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    for response in described:
        for entry in getattr(response, "groups", []):
            # (error_code, group_id, state, protocol_type, protocol, members, ...)
            if entry[1] == group:
                return str(entry[2]) or "Dead"
    return "Dead"


async def log_ends(
    transport: KafkaTransport, tps: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    """(first offset, end offset) of each partition: the end from fetch high watermarks."""
    wanted = [_KTP(tp.topic, tp.partition) for tp in tps]
    consumer = aiokafka.AIOKafkaConsumer(
        **transport.client_options,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="flowkit-offsets",
    )
    await transport.connect(consumer.start, consumer.stop)
    try:
        with map_kafka_errors():
            consumer.assign(wanted)
            first = await consumer.beginning_offsets(wanted)
            for _ in range(_POLLS):
                if all(consumer.highwater(tp) is not None for tp in wanted):
                    break
                await consumer.getmany(timeout_ms=_POLL_MS, max_records=1)
                await asyncio.sleep(0)
        out = {}
        for tp in wanted:
            low = int(first.get(tp, 0))
            high = consumer.highwater(tp)
            # A broker need not answer a fetch for an empty partition: no watermark.
            out[TopicPartition(tp.topic, tp.partition)] = (low, low if high is None else high)
        return out
    finally:
        await consumer.stop()


async def offsets_at(
    transport: KafkaTransport, tps: Iterable[TopicPartition], timestamp_ms: int
) -> dict[TopicPartition, int | None]:
    """The first offset at or after ``timestamp_ms`` per partition (None: none is)."""
    wanted = [_KTP(tp.topic, tp.partition) for tp in tps]
    consumer = aiokafka.AIOKafkaConsumer(
        **transport.client_options,
        group_id=None,
        enable_auto_commit=False,
        client_id="flowkit-offsets",
    )
    await transport.connect(consumer.start, consumer.stop)
    try:
        with map_kafka_errors():
            found = await consumer.offsets_for_times({tp: timestamp_ms for tp in wanted})
        return {
            TopicPartition(tp.topic, tp.partition): None if at is None else int(at.offset)
            for tp, at in found.items()
        }
    finally:
        await consumer.stop()
