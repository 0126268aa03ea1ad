"""OffsetTracker: whatever the completion order, a commit never passes a pending batch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flowkit.checkpoint import OffsetTracker
from flowkit.records import TopicPartition

TP = TopicPartition("t", 0)


@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30),
    holders=st.integers(1, 3),
    data=st.data(),
)
def test_committable_never_passes_a_pending_batch(
    sizes: list[int], holders: int, data: st.DataObject
) -> None:
    tracker = OffsetTracker()
    entries = []
    end = 0
    for size in sizes:
        end += size
        entries.append(tracker.add(TP, end, holders))
    releases = [i for i in range(len(entries)) for _ in range(holders)]
    order = data.draw(st.permutations(releases))
    last = 0
    for step, i in enumerate(order):
        entries[i].release()
        offsets = tracker.committable()
        done = {j for j in range(len(entries)) if entries[j].holders == 0}
        prefix = 0
        while prefix in done:
            prefix += 1
        expected = entries[prefix - 1].end if prefix else None
        if offsets:
            assert offsets[TP] == expected
            assert offsets[TP] >= last  # monotone
            last = offsets[TP]
            tracker.committed(offsets)
        else:
            assert expected is None or expected == last
        if step == len(order) - 1:
            assert tracker.in_flight() == 0 and last == end


def test_forget_drops_a_partition() -> None:
    tracker = OffsetTracker()
    tracker.add(TP, 5, 1)
    tracker.forget([TP])
    assert tracker.in_flight() == 0 and tracker.committable() == {}


def test_progress_commits_part_of_the_oldest_batch() -> None:
    tracker = OffsetTracker()
    entry = tracker.add(TP, 100, 1)
    position: list[int | None] = [None]
    entry.progress = lambda: position[0]
    assert tracker.committable() == {}  # not started
    position[0] = 42  # records 0..41 are done, 42 is being processed
    assert tracker.committable() == {TP: 42}
    tracker.committed({TP: 42})
    assert tracker.committable() == {}
    entry.release()
    assert tracker.committable() == {TP: 100}


async def test_done_batches_are_freed_without_the_cycle_collector() -> None:
    """A processed batch must not wait for a gc pass: a worker fetches records faster than
    gen-2 collections run, and every batch kept alive keeps its records alive."""
    import gc

    import flowkit
    from flowkit.streams import Batch
    from flowkit.testing import TestDriver

    app = flowkit.App("freed", partitions=2)
    topic = app.topic("t", value_type=int)
    seen: list[int] = []

    @app.agent(topic)
    async def read(stream: flowkit.Stream[int]) -> None:
        async for v in stream:
            seen.append(v)

    gc.collect()
    gc.disable()
    try:
        async with TestDriver(app) as driver:
            for i in range(50):
                await driver.send(topic, i, partition=i % 2)
                if i % 10 == 9:
                    await driver.run_until_idle()
            await driver.run_until_idle()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, Batch)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert len(seen) == 50
    assert cyclic == []
