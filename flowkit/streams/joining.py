"""The stream of an agent over a ``StreamJoin``: both topics' records through the join's
buffers, out as ``Joined`` results (see ``flowkit.state.joins``).

The two topics arrive as separate batches, so a whole batch of one could move stream time
past every record of the other's next batch and make them all late. As Kafka Streams
does, the records of a partition are taken from both topics in timestamp order: batches
wait side by side (``source.join_held``), and when one side has nothing waiting while its
partition has records not fetched yet (``source.behind``), the join waits for them.

The loop picks a partition (the one whose next record is oldest), then merges the heads
of its two sides record by record until one of them is done: the choice of partition is
made once per batch, not once per record. A head stamped beyond the join's guard on
stream time (``max_future``, see ``flowkit.streamtime``) is taken at once, out of order:
it only goes to the dead-letter topic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..errors import DecodeError, FutureRecord, LateRecord
from ..records import TopicPartition
from ._loop import SKIP, interpreted

if TYPE_CHECKING:
    from .batches import Batch
    from .source import StreamSource

__all__ = ["joined"]


def _pick(source: StreamSource, flush: bool) -> int | None:
    """The partition whose next held record comes first, or None to wait for more. A
    partition with one side held waits while the other side's partition has lag."""
    best: int | None = None
    best_ts = 0
    join = source.join
    for p, (left, right) in source.join_held.items():
        if left:
            head = left[0]
            ts = head.messages[head.cursor].timestamp
            if right:
                head = right[0]
                other = head.messages[head.cursor].timestamp
                if other < ts:
                    ts = other
            elif not flush and source.behind(TopicPartition(join.right.name, p)):
                continue
        elif right:
            if not flush and source.behind(TopicPartition(join.left.name, p)):
                continue
            head = right[0]
            ts = head.messages[head.cursor].timestamp
        else:
            continue
        if best is None or ts < best_ts:
            best, best_ts = p, ts
    return best


def _hold(source: StreamSource, batches: list[Batch]) -> None:
    held = source.join_held
    left_name = source.join.left.name
    for batch in batches:
        batch.cursor = 0
        sides = held.get(batch.tp.partition)
        if sides is None:
            sides = held[batch.tp.partition] = (deque(), deque())
        sides[0 if batch.tp.topic == left_name else 1].append(batch)


def _held(source: StreamSource) -> int:
    return sum(len(left) + len(right) for left, right in source.join_held.values())


async def joined(source: StreamSource, ops: tuple[tuple[str, Any], ...]) -> AsyncIterator[Any]:
    """Each record of either topic, in timestamp order per partition, processed by the
    join; its results, after ``ops``."""
    join = source.join
    store = source.stores[join]
    process = store.process
    post = interpreted(ops) if ops else None
    held = source.join_held
    # Batches taken from the queue and held: up to this many, unless a join must see
    # more to go on (the queue's bound is the fetcher's backpressure).
    limit = 2 * max(source.capacity, 1)
    ended = False
    # Started again after an error: the record that failed is done (dead-lettered), and
    # so is a batch whose last record it was.
    for part in store.parts.values():
        if part.settle:
            store.settle(part)
    for sides in held.values():
        for q in sides:
            while q and q[0].cursor >= len(q[0].messages):
                source.finish(q.popleft())
    while True:
        if source.pending() and _held(source) < limit:
            _hold(source, source.take_queued())
        p = _pick(source, ended)
        if source.pending() and (p is None or not all(held[p])):
            # Nothing to do, or one side of the partition is empty: the queue may hold
            # what is missing (the fetcher counts it as fetched, not as lag).
            _hold(source, source.take_queued())
            p = _pick(source, ended)
        if p is None:
            if ended:
                return
            waited = await source.next_batch()
            if waited is None:
                ended = True
                continue
            source.at(None, -1)  # it is held; the cursor is set per record
            _hold(source, [waited])
            continue
        left_q, right_q = sides = held[p]
        lb = left_q[0] if left_q else None
        rb = right_q[0] if right_q else None
        # One side with nothing held (its partition has no lag): after a result, look
        # again, since the agent may have waited and records of that side come meanwhile.
        one_sided = lb is None or rb is None
        part = store.part(p)
        limit = store.future_limit
        while True:
            # Timestamp order. ``top`` is the later head's time (or the only head's): the
            # join's guard on stream time is checked on it here, where the times are read,
            # one comparison a record for both heads (the store trusts its caller).
            if rb is None:
                assert lb is not None
                batch, side = lb, 0
                top = lb.messages[lb.cursor].timestamp
            elif lb is None:
                batch, side = rb, 1
                top = rb.messages[rb.cursor].timestamp
            else:
                lt = lb.messages[lb.cursor].timestamp
                top = rb.messages[rb.cursor].timestamp
                if lt <= top:
                    batch, side = lb, 0
                else:
                    batch, side, top = rb, 1, lt
            future = False
            if top > limit:  # past the cached limit: refreshed from the wall clock, or...
                if store.admits(top):
                    limit = store.future_limit
                else:
                    # ...beyond the join's guard on stream time: that head is taken now,
                    # out of timestamp order, and dead-lettered below. It moves nothing,
                    # and in its place it would hold back its whole topic: the records
                    # behind it would wait for the other topic to reach its time.
                    future = True
                    if rb is not None and rb.messages[rb.cursor].timestamp == top:
                        batch, side = rb, 1
                    else:
                        assert lb is not None
                        batch, side = lb, 0
            i = batch.cursor
            batch.cursor = i + 1
            source.at(batch, i)
            m = batch.messages[i]
            try:
                if future:  # (a record that does not decode is that first)
                    if m.key is not None and m.value is not None:
                        try:
                            batch.decode(m.value)
                        except Exception as exc:
                            raise batch.topic.decode_error(exc) from None
                    raise store.future_record(m.timestamp)
                if m.key is None or m.value is None:  # nothing to join on, but its time counts
                    results = store.tick(part, m.timestamp)
                else:
                    try:
                        v = source.value = batch.decode(m.value)
                    except Exception as exc:
                        raise batch.topic.decode_error(exc) from None
                    results = process(part, side, m.key, m.offset, m.timestamp, m.value, v)
            except (DecodeError, LateRecord, FutureRecord) as error:
                # The record's own fault: dead-lettered where it was found, and the join
                # goes on with the next one (not started again, which costs its agent's
                # local state).
                await source.refuse(error)
                results = None
            if results:
                for result in results:
                    if post is not None:
                        result = post(result, batch.topic, m)
                        if result is SKIP:
                            continue
                    yield result
                if part.settle:
                    store.settle(part)
            part.high[side] = m.offset  # done: its outputs are with the publisher
            part.done = part.time
            if batch.cursor >= len(batch.messages):
                sides[side].popleft()
                source.finish(batch)
                break  # pick again: this side's next batch, or wait for one
            if results and one_sided:
                source.at(None, -1)
                break
