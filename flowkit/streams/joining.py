"""The stream of an agent over a ``StreamJoin``: both topics' records through the join's
buffers, out as ``Joined`` results (see ``flowkit.state.joins``).

The two topics arrive as separate batches, so a whole batch of one could move stream time
past every record of the other's next batch and make them all late. As Kafka Streams
does, the records of a partition are taken from both topics in timestamp order: batches
wait side by side (``source.join_held``), and when one side has nothing waiting while its
partition has records not fetched yet (``source.behind``), the join waits for them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ._loop import SKIP, interpreted

if TYPE_CHECKING:
    from .source import Batch, StreamSource

__all__ = ["joined"]


def _next(source: StreamSource, flush: bool) -> Batch | None:
    """The held batch whose next record comes first, or None to wait for more."""
    best: Batch | None = None
    best_ts = 0
    for sides in source.join_held.values():
        left, right = sides
        if not left and not right:
            continue
        heads = [q[0] for q in sides if q]
        if len(heads) == 1 and not flush:
            empty = right if left else left
            other = empty is right
            # The side with nothing held: wait for it while its partition has lag.
            tp = heads[0].tp
            topic = source.join.right.name if other else source.join.left.name
            if source.behind(type(tp)(topic, tp.partition)):
                continue
        for batch in heads:
            ts = batch.messages[batch.cursor].timestamp
            if best is None or ts < best_ts:
                best, best_ts = batch, ts
    return best


async def joined(source: StreamSource, ops: tuple[tuple[str, Any], ...]) -> AsyncIterator[Any]:
    """Each record of either topic, in timestamp order per partition, processed by the
    join; its results, after ``ops``."""
    join = source.join
    store = source.stores[join]
    left_name = join.left.name
    post = interpreted(ops) if ops else None
    held = source.join_held
    ended = False
    # Started again after an error: a batch whose last record failed is done now.
    for sides in held.values():
        for q in sides:
            while q and q[0].cursor >= len(q[0].messages):
                done = q.popleft()
                source.records += len(done.messages)
                source._finish(done)
    while True:
        for got in source.take_queued():  # every batch there is, before choosing
            got.cursor = 0
            sides = held.setdefault(got.tp.partition, (deque(), deque()))
            sides[0 if got.tp.topic == left_name else 1].append(got)
        batch = _next(source, ended)
        if batch is None:
            if ended:
                return
            waited = await source._next_batch()
            if waited is None:
                ended = True
                continue
            source.batch = None  # it is held below; `batch` is set per record
            waited.cursor = 0
            sides = held.setdefault(waited.tp.partition, (deque(), deque()))
            sides[0 if waited.tp.topic == left_name else 1].append(waited)
            continue
        side = 0 if batch.tp.topic == left_name else 1
        i = batch.cursor
        batch.cursor = i + 1
        source.batch = batch
        source._set_pos(i)
        m = batch.messages[i]
        part = store.part(batch.tp.partition)
        if m.key is None or m.value is None:  # nothing to join on, but its time counts
            results = store.tick(part, m.timestamp)
        else:
            try:
                v = source.value = batch.decode(m.value)
            except Exception as exc:
                raise batch.topic.decode_error(exc) from None
            results = store.process(part, side, m.key, m.offset, m.timestamp, m.value, v)
        for result in results:
            if post is not None:
                result = post(result, batch.topic, m)
                if result is SKIP:
                    continue
            yield result
        if batch.cursor >= len(batch.messages):
            held[batch.tp.partition][side].popleft()
            source.records += len(batch.messages)
            source._finish(batch)
        else:
            source.batch = None
