"""Reading partitions to their end: table recovery, global tables, dead letters, tests.

"The end" is the high watermark that fetches report (``Consumer.highwater``), taken
partition by partition once the consumer's position reaches it. It is not asked for with
ListOffsets (aiokafka's ``end_offsets``): some brokers answer that wrongly (Tansu, which
the Kafka tests run on), while the watermark in a fetch response is what the broker
really holds.

>>> import asyncio
>>> from flowkit.transports import MemoryTransport
>>> async def demo():
...     async with MemoryTransport() as transport:
...         transport.broker.create_topic("words", 2)
...         for word in (b"a", b"b", b"c"):
...             transport.broker.append("words", word)
...         seen = []
...         count = await read_topic(
...             transport, "words", lambda tp, ms: seen.extend(m.value for m in ms),
...             client_id="demo",
...         )
...         return count, sorted(seen)
>>> asyncio.run(demo())
(3, [b'a', b'b', b'c'])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ..errors import ReadStalled
from ..records import Message, TopicPartition
from .base import Consumer, Transport

__all__ = ["Apply", "read_to_end", "read_topic"]

Apply = Callable[[TopicPartition, Sequence[Message]], None]
"""What to do with each batch read: called with its partition and its records, in order."""

_MAX_RECORDS = 50_000
_POLL_TIMEOUT = 0.05
# Empty polls in a row after which a partition that never reported a high watermark counts
# as empty (a broker need not answer for an empty partition), and after which reading
# gives up with ReadStalled: 20 and 200 polls of at most _POLL_TIMEOUT s, about 1 s and 10 s.
_QUIET_POLLS = 20
_STALL_POLLS = 200


async def read_to_end(consumer: Consumer, tps: Iterable[TopicPartition], apply: Apply) -> int:
    """Read ``tps`` to the high watermark their fetches report; returns the records read.

    ``consumer`` must have ``tps`` assigned (a group-less consumer, ``assign``) and reads
    from its position, the start of each partition for a new group-less consumer reading
    from the earliest offset. ``apply`` gets every batch, in offset order per partition.
    Records that arrive while reading may be read too; a partition is done once its
    position reaches the watermark its last fetch reported.

    A partition that reported no watermark after about 1 s of empty polls is taken as
    empty. Raises ``ReadStalled`` after about 10 s of empty polls while a partition is
    still below its watermark.
    """
    total = 0
    remaining = set(tps)
    empty_polls = 0
    timeout = 0.0  # the first look does not wait: an empty changelog is the common case
    while remaining:
        batches = await consumer.getmany(timeout, _MAX_RECORDS)
        timeout = _POLL_TIMEOUT
        for tp, messages in batches.items():
            apply(tp, messages)
            total += len(messages)
        for tp in list(remaining):
            high = consumer.highwater(tp)
            if high is not None and consumer.position(tp) >= high:
                remaining.discard(tp)
        if batches:
            empty_polls = 0
            continue
        empty_polls += 1
        if empty_polls >= _QUIET_POLLS:
            remaining = {tp for tp in remaining if consumer.highwater(tp) is not None}
            if remaining and empty_polls >= _STALL_POLLS:
                raise ReadStalled(
                    f"reading to the end stalled: no record in {empty_polls} polls while"
                    f" {_describe(consumer, remaining)}"
                )
    return total


async def read_topic(transport: Transport, topic: str, apply: Apply, *, client_id: str) -> int:
    """Read every partition of ``topic`` from its start to its end, as ``read_to_end``
    does, with a group-less consumer of its own; returns the records read.

    A topic that does not exist has nothing to read (0), and is not created.
    """
    count = await transport.partition_count(topic)
    if not count:
        return 0
    consumer = transport.consumer(group_id=None, client_id=client_id)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        return await read_to_end(consumer, tps, apply)
    finally:
        await consumer.aclose()


def _describe(consumer: Consumer, tps: Iterable[TopicPartition]) -> str:
    return ", ".join(
        f"{tp.topic}[{tp.partition}] is at {consumer.position(tp)} of {consumer.highwater(tp)}"
        for tp in sorted(tps)
    )
