"""A consumer group seen from outside, over librdkafka: what ``flowkit.transports.kafka.groups``
answers over aiokafka, for ``flowkit offsets`` with ``client=rdkafka``.

As there, the end of a partition is the high watermark of a fetch (librdkafka's cached
watermark, which its fetches keep), never ListOffsets(latest), which some Kafka-compatible
brokers answer wrongly; the start is ListOffsets(earliest); a time is turned into offsets
with ListOffsets by time (``offsets_for_times``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient

from ...records import TopicPartition
from .consumer import RdkafkaConsumer, _watermarks
from .errors import map_rdkafka_errors
from .settings import client_config
from .transport import RdkafkaTransport

__all__ = ["group_state", "log_ends", "offsets_at"]

_POLL_S = 0.05
_POLLS = 40  # about 2 s in all before an unanswered partition is taken as empty

# The coordinator's states, named as Kafka (and aiokafka's answer) names them.
_STATES = {
    ck.ConsumerGroupState.EMPTY: "Empty",
    ck.ConsumerGroupState.DEAD: "Dead",
    ck.ConsumerGroupState.STABLE: "Stable",
    ck.ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
    ck.ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
}


async def group_state(transport: RdkafkaTransport, group: str) -> str:
    """The group's state as the coordinator reports it: ``Empty`` or ``Dead`` when no
    member is alive, ``Stable`` or ``PreparingRebalance``/``CompletingRebalance`` when
    members are (``Unknown`` if the answer names none of these)."""
    admin = AdminClient(
        {
            **transport.base_config,
            **client_config(transport.settings, "admin"),
            "client.id": transport.client_id("flowkit-offsets") + "-admin",
        }
    )
    await transport.connect(admin)
    futures = admin.describe_consumer_groups([group], request_timeout=transport.connect_timeout)
    try:
        described = await asyncio.wrap_future(futures[group])
    except ck.KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, ck.KafkaError) and error.code() == ck.KafkaError.GROUP_ID_NOT_FOUND:
            return "Dead"  # (as a coordinator that never saw the group answers)
        with map_rdkafka_errors():
            raise
    return _STATES.get(described.state, "Unknown")


async def log_ends(
    transport: RdkafkaTransport, tps: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    """(first offset, end offset) of each partition: the end from fetch high watermarks."""
    wanted = list(tps)
    consumer = transport.consumer(group_id=None, client_id="flowkit-offsets")
    await consumer.start()
    try:
        consumer.assign(wanted)
        for _ in range(_POLLS):
            if all(consumer.highwater(tp) is not None for tp in wanted):
                break
            await consumer.getmany(_POLL_S, 1)
        firsts = await _call(consumer, lambda kafka, timeout: _firsts(kafka, wanted, timeout))
        out = {}
        for tp in wanted:
            low = firsts[tp]
            high = consumer.highwater(tp)
            # A broker need not answer a fetch for an empty partition: no watermark.
            out[tp] = (low, low if high is None else high)
        return out
    finally:
        await consumer.aclose()


async def offsets_at(
    transport: RdkafkaTransport, tps: Iterable[TopicPartition], timestamp_ms: int
) -> dict[TopicPartition, int | None]:
    """The first offset at or after ``timestamp_ms`` per partition (None: none is)."""
    wanted = [ck.TopicPartition(tp.topic, tp.partition, timestamp_ms) for tp in tps]
    consumer = transport.consumer(group_id=None, client_id="flowkit-offsets")
    await consumer.start()
    try:
        found = await _call(
            consumer, lambda kafka, timeout: kafka.offsets_for_times(wanted, timeout=timeout)
        )
        return {
            TopicPartition(k.topic, k.partition): None if k.offset < 0 else int(k.offset)
            for k in found
        }
    finally:
        await consumer.aclose()


async def _call(consumer: RdkafkaConsumer, call: Any) -> Any:
    # A blocking call on the consumer's librdkafka handle, off the event loop.
    with map_rdkafka_errors():
        return await consumer.call_blocking(call)


def _firsts(kafka: Any, tps: list[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
    return {
        tp: _watermarks(kafka, ck.TopicPartition(tp.topic, tp.partition), timeout)[0] for tp in tps
    }
