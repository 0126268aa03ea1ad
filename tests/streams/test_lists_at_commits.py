"""Agents at an exactly-once commit (a ``Barrier``): ``take()`` and ``batches()`` lists,
and where the barrier is queued when several agents read one partition.

A list is filled across fetched batches, and a batch may be split between two lists. At
an exactly-once commit every agent instance stops at a barrier queued behind its batches,
and the transaction commits the offsets of every batch before it with the effects of its
records: so when the barrier is reached, each record before it must have been handed to
the agent in a list that the agent has finished, and its batch must be done; none after
it may have been.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flowkit.records import Message, TopicPartition
from flowkit.streams import Barrier, Batch, StreamSource
from flowkit.streams._loop import FILTER
from flowkit.topics import Topic

TP = TopicPartition("t", 0)


async def at_the_barrier(
    sizes: list[int], barrier_at: int, max_size: int, odd_only: bool, within: float | None
) -> tuple[list[int], list[int], list[int]]:
    """(batches done, values processed, values processed after release) when the barrier
    queued before batch ``barrier_at`` is reached by a list loop over ``sizes`` batches."""
    topic: Topic[int] = Topic("t", value_type=int)
    source = StreamSource("agent", maxsize=len(sizes) + 2)
    barrier = Barrier(1)
    done: list[int] = []
    offset = 0
    for i, size in enumerate(sizes):
        if i == barrier_at:
            await source.put(barrier)
        messages = [Message("t", 0, offset + j, 0, None, b"%d" % (offset + j)) for j in range(size)]
        offset += size
        await source.put(Batch(topic, TP, messages, lambda i=i: done.append(i)))
    if barrier_at == len(sizes):
        await source.put(barrier)
    source.close()
    ops: tuple[tuple[str, Any], ...] = ((FILTER, lambda v: v % 2 == 1),) if odd_only else ()
    processed: list[int] = []
    seen: tuple[list[int], list[int]] | None = None

    async def agent() -> None:
        async for listed in source.chunks(ops, max_size, within):
            assert 0 < len(listed) <= max_size
            await asyncio.sleep(0)  # the agent's work on the list
            processed.extend(listed)

    async def checkpoint() -> None:
        nonlocal seen
        await barrier.arrived()
        seen = (sorted(done), list(processed))
        barrier.release()

    async with asyncio.timeout(10), asyncio.TaskGroup() as tasks:
        tasks.create_task(agent())
        tasks.create_task(checkpoint())
    assert seen is not None
    return seen[0], seen[1], processed


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    data=st.data(),
    max_size=st.integers(1, 12),
    odd_only=st.booleans(),
    within=st.sampled_from([None, 30.0]),
)
def test_at_a_barrier_every_record_before_it_is_processed_and_none_after(
    sizes: list[int], data: st.DataObject, max_size: int, odd_only: bool, within: float | None
) -> None:
    barrier_at = data.draw(st.integers(0, len(sizes)))
    done, processed, everything = asyncio.run(
        at_the_barrier(sizes, barrier_at, max_size, odd_only, within)
    )
    before = sum(sizes[:barrier_at])
    wanted = [v for v in range(before) if not odd_only or v % 2 == 1]
    assert done == list(range(barrier_at))
    assert processed == wanted
    assert everything == [v for v in range(sum(sizes)) if not odd_only or v % 2 == 1]


async def test_a_barrier_stops_every_reader_of_a_partition_after_the_same_record() -> None:
    # Two agents read one partition; one is on the third batch, the other has started none.
    # The commit's barrier goes ahead of what neither has started: both stop after the
    # last record of the third batch (not after everything queued), so the transaction
    # holds the same records' effects from both, and their offsets.
    topic: Topic[int] = Topic("t", value_type=int)
    fast = StreamSource("fast", maxsize=8, exactly_once=True)
    slow = StreamSource("slow", maxsize=8, exactly_once=True)
    offset = 0
    for values in ([0, 1, 2], [3, 4], [5, 6, 7], [8]):
        messages = [Message("t", 0, offset + i, 0, None, b"%d" % v) for i, v in enumerate(values)]
        offset += len(values)
        for source in (fast, slow):
            await source.put(Batch(topic, TP, messages, lambda: None))
    for source in (fast, slow):
        source.close()
    seen: dict[str, list[int]] = {"fast": [], "slow": []}
    on_five = asyncio.Event()
    go = asyncio.Event()

    async def agent(source: StreamSource) -> None:
        async for value in source.iterate(()):
            seen[source.name].append(value)
            if value == 5 and source is fast:
                on_five.set()
                await go.wait()

    async with asyncio.timeout(10), asyncio.TaskGroup() as tasks:
        tasks.create_task(agent(fast))
        await on_five.wait()
        assert fast.taken == {TP: 7} and slow.taken == {}
        barrier = Barrier(2)
        cut = {TP: max(fast.taken[TP], slow.taken.get(TP, -1))}  # what Checkpointer does
        for source in (fast, slow):
            source.queue_barrier(barrier, cut)
        go.set()
        tasks.create_task(agent(slow))
        await barrier.arrived()
        assert seen == {"fast": list(range(8)), "slow": list(range(8))}
        barrier.release()
    assert seen == {"fast": list(range(9)), "slow": list(range(9))}


async def test_a_batch_a_timed_wait_dequeued_before_the_cut_is_in_the_cut() -> None:
    """A list that waits ``within`` for more records waits in a task of its own; a batch
    put while it waits must count as taken (in the cut) from the moment it leaves the
    queue, or a barrier queued before the agent resumes goes behind it in the other
    readers' queues and ahead of nothing in this one: the agent then processes the batch
    before the barrier while the other readers stop before it, and the commit holds this
    agent's state of records whose offsets it does not commit."""
    topic: Topic[int] = Topic("t", value_type=int)
    source = StreamSource("agent", exactly_once=True)
    processed: list[int] = []
    at_barrier: list[int] = []

    def batch(offset: int) -> Batch:
        return Batch(topic, TP, [Message("t", 0, offset, 0, None, b"%d" % offset)], lambda: None)

    async def agent() -> None:
        async for listed in source.chunks((), 5, 30.0):  # b0 alone: it waits for more
            processed.extend(listed)

    await source.put(batch(0))
    task = asyncio.create_task(agent())
    for _ in range(5):
        await asyncio.sleep(0)  # the list holds 0 and waits, with a deadline, for more
    await source.put(batch(1))  # wakes the wait: the fetcher's dispatch
    await asyncio.sleep(0)  # the fetcher goes on; the waiting get runs (and takes it?)
    barrier = Barrier(1)
    source.queue_barrier(barrier, dict(source.taken))  # the checkpoint, under the gate

    async def checkpoint() -> None:
        await barrier.arrived()
        at_barrier.extend(processed)
        barrier.release()

    async with asyncio.timeout(10):
        await checkpoint()
        source.close()
        await task
    # The barrier came before batch 1 in this queue, as in every other reader's: only the
    # record of batch 0 was processed when the barrier was reached.
    assert at_barrier == [0]
    assert processed == [0, 1]
