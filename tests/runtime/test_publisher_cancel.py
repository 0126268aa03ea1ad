"""A publisher's waits may be cancelled (a worker stops, a forced stop cancels its tasks),
and nothing may be lost or broken for the wait that comes next: the final checkpoint.

The producer here stores each batch at once but holds its acknowledgement, as a Kafka
client's delivery future is pending until the broker answers; another one also yields
before it stores a batch, as a Kafka client does when its buffer is full. The same
checkpoint runs against real brokers in tests/transports/test_publisher_acks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence

from flowkit.runtime.output.publisher import Publisher
from flowkit.transports import Ack, OutRecord
from flowkit.transports.memory import MemoryBroker, MemoryProducer

PARTITIONS = 3


class _HeldProducer(MemoryProducer):
    """Stores every batch (after one turn of the loop, if ``slow``), acknowledges it only
    once ``release`` is set."""

    def __init__(self, broker: MemoryBroker, release: asyncio.Event, *, slow: bool) -> None:
        super().__init__(broker)
        self.release = release
        self.slow = slow

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        if self.slow:
            await asyncio.sleep(0)
        acks = await super().send_batch(topic, partition, records)

        async def later(ack: Awaitable[Ack]) -> Ack:
            await self.release.wait()
            return await ack

        return [(n, asyncio.ensure_future(later(ack))) for n, ack in acks]


async def _partitions(topic: str) -> int:
    return PARTITIONS


def _publisher(*, slow: bool = False) -> tuple[Publisher, MemoryBroker, asyncio.Event]:
    broker, release = MemoryBroker(), asyncio.Event()
    broker.create_topic("out", PARTITIONS)
    publisher = Publisher(_HeldProducer(broker, release, slow=slow), partition_count=_partitions)
    return publisher, broker, release


def _publish(publisher: Publisher, n: int, *, scheduled: bool = True) -> None:
    # ``place`` does not schedule the publisher's own flush: the test's flush sends them.
    put = publisher.publish if scheduled else publisher.place
    for i in range(n):
        put("out", f"v{i}".encode(), f"k{i}".encode(), (), None)


def _stored(broker: MemoryBroker) -> list[bytes]:
    return sorted(m.value or b"" for p in range(PARTITIONS) for m in broker.messages("out", p))


def _ends(broker: MemoryBroker) -> dict[tuple[str, int], int]:
    return {("out", p): len(broker.messages("out", p)) for p in range(PARTITIONS)}


async def _cancel(task: asyncio.Task[None]) -> None:
    assert not task.done()  # it waits: what this test is about
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_checkpoint_cancelled_while_it_waits_leaves_every_send_to_the_next() -> None:
    publisher, broker, release = _publisher()
    _publish(publisher, 30)
    await publisher.flush()
    waiting = asyncio.create_task(publisher.await_acks())
    await asyncio.sleep(0)  # it awaits the first send's ack
    await _cancel(waiting)

    release.set()
    await publisher.await_acks()  # the final checkpoint: no CancelledError, nothing skipped
    assert publisher.sent_end == _ends(broker)
    assert publisher.all_acked()


async def test_a_latency_watch_stopped_leaves_the_sends_it_watched_alone() -> None:
    publisher, broker, release = _publisher()
    _publish(publisher, 30)
    await publisher.flush()
    calls: list[bool] = []
    publisher.when_acknowledged(calls.append)
    await asyncio.sleep(0)
    publisher.stop_watching()  # the worker stops: the watch goes, the sends do not
    await asyncio.sleep(0)

    release.set()
    await publisher.await_acks()
    assert publisher.sent_end == _ends(broker)
    assert calls == []


async def test_a_flush_cancelled_halfway_sends_the_rest_of_its_round() -> None:
    publisher, broker, release = _publisher(slow=True)
    release.set()
    _publish(publisher, 30, scheduled=False)
    flushing = asyncio.create_task(publisher.flush())
    await asyncio.sleep(0)  # it took the round's records and waits to store the first batch
    await _cancel(flushing)

    await publisher.await_acks()  # the final checkpoint sends what the round had taken
    assert _stored(broker) == sorted(f"v{i}".encode() for i in range(30))
    assert publisher.sent_end == _ends(broker)
    assert all(publisher.sent_end[("out", p)] > 0 for p in range(PARTITIONS))
