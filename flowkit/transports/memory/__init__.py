"""The embedded broker (``memory://``): partitioned logs and consumer groups in one process.

``broker`` holds ``MemoryBroker``, a small Kafka: named topics with N partitions, each an
append-only log with offsets; consumer groups with committed offsets and range assignment
across members; bounded memory through per-partition retention. ``clients`` puts the
``Transport`` protocol over it (``MemoryTransport``, ``MemoryConsumer``, ``MemoryProducer``).
Several transports may share one broker, which is how tests simulate several workers, or a
worker restarting and resuming from its group's committed offsets.

Everything runs on one event loop; nothing here is thread-safe.

>>> import asyncio
>>> from flowkit.records import TopicPartition
>>> async def demo():
...     async with MemoryTransport() as transport:
...         producer = transport.producer()
...         ack = await (await producer.send("words", b"hello", key=b"k"))
...         consumer = transport.consumer(group_id=None)
...         consumer.assign([TopicPartition("words", ack.partition)])
...         batch = await consumer.getmany(timeout=0.1, max_records=10)
...         return [m.value for msgs in batch.values() for m in msgs]
>>> asyncio.run(demo())
[b'hello']
"""

from __future__ import annotations

from .broker import MemoryBroker
from .clients import MemoryConsumer, MemoryProducer, MemoryTransport

__all__ = ["MemoryBroker", "MemoryConsumer", "MemoryProducer", "MemoryTransport"]
