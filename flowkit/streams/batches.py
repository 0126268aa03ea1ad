"""What a ``StreamSource`` queues for its agent instance: fetched batches, and the
barriers an exactly-once checkpoint puts among them.

A ``Batch`` is one fetched batch of one partition on its way through one agent instance;
a ``Barrier`` stops every instance where a checkpoint cuts; ``BatchQueue`` is the queue
that lets a barrier in ahead of the batches no instance has started.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..records import Message, RawMessages, TopicPartition

if TYPE_CHECKING:
    from ..topics import Topic

__all__ = ["Barrier", "Batch", "BatchQueue"]


class Batch:
    """One fetched batch of one partition on its way through one agent instance."""

    __slots__ = ("cursor", "decode", "memo", "messages", "on_done", "records", "topic", "tp")

    def __init__(
        self,
        topic: Topic[Any],
        tp: TopicPartition,
        messages: Sequence[Message],
        on_done: Callable[[], None],
    ) -> None:
        self.topic = topic
        self.tp = tp
        self.messages = messages
        # The records as the batch holds them: the list of Messages, or a client's own
        # records (``RawMessages.raw``); what ``current_record`` indexes, with no class
        # check per call (an agent's outputs ask it once per output).
        self.records: Sequence[Any] = (
            messages.raw if messages.__class__ is RawMessages else messages
        )
        self.decode = topic.decoder()
        self.on_done = on_done
        # Per-batch state a table looks up once per batch, not per record (for a windowed
        # table: itself, its store in this worker and the store's part for this partition).
        self.memo: Any = None
        self.cursor = 0  # a join's next record in this batch (batches held side by side)


class Barrier(Batch):
    """Queued for every agent instance by an exactly-once checkpoint (``queue_barrier``):
    behind the batches the instance must finish, ahead of the others.

    An agent that takes it has finished every batch queued before it (and started none
    after it): it waits there until ``release``. Once ``arrived`` says every instance is
    there, no record is half-processed, so the checkpoint's transaction holds exactly the
    effects of the records it commits. It has no messages: readers of the queue set it
    apart with the empty batches.
    """

    __slots__ = ("_all", "_count", "_released")

    def __init__(self, count: int) -> None:  # no topic, no records: not a batch of any
        self.messages = ()
        self._count = count  # instances that have not reached it yet
        self._all = asyncio.Event()
        self._released = asyncio.Event()
        if count <= 0:
            self._all.set()

    async def reached(self) -> None:
        """An instance reached the barrier: wait there until ``release``."""
        self._count -= 1
        if self._count <= 0:
            self._all.set()
        await self._released.wait()

    async def arrived(self) -> None:
        """Wait until every instance has reached the barrier."""
        await self._all.wait()

    def release(self) -> None:
        """Let the instances go on."""
        self._released.set()


class BatchQueue(asyncio.Queue["Batch | None"]):
    """The queue of a source: an ``asyncio.Queue`` that an exactly-once checkpoint may put
    a barrier into ahead of queued batches (``put_ahead``)."""

    _queue: deque[Batch | None]
    _getters: deque[asyncio.Future[None]]
    _wakeup_next: Callable[[deque[asyncio.Future[None]]], None]

    async def ready(self) -> None:
        """Wait until an item is queued, and leave it there (``get`` takes it).

        A wait with a deadline runs in a task of its own, which ``get`` would take the item
        in: until the reader's task resumed, the item would be neither queued nor taken,
        and an exactly-once checkpoint cutting in between would not see it (``_cut``)."""
        while self.empty():
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except BaseException:
                waiter.cancel()
                if waiter in self._getters:
                    self._getters.remove(waiter)
                if not self.empty() and not waiter.cancelled():
                    self._wakeup_next(self._getters)  # pass the wake-up on, as get does
                raise

    def put_ahead(self, item: Batch, ahead: Callable[[Batch | None], bool]) -> None:
        """Put ``item`` behind the queued items ``ahead`` is true of and before the rest,
        each part in its order. Never waits: a full queue holds one more."""
        queued = self._queue
        if not queued:
            self.put_nowait(item)  # wakes a reader waiting on the empty queue
            return
        # Not empty: no reader waits on it, so nothing needs waking.
        kept = [x for x in queued if ahead(x)]
        rest = [x for x in queued if not ahead(x)]
        queued.clear()
        queued.extend(kept)
        queued.append(item)
        queued.extend(rest)
