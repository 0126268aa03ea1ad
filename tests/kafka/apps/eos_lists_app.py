"""Two agents that process lists of records (``take()`` and ``batches()``), for the
exactly-once tests.

Both read ``eosl-items`` and count the items of each key in a table of their own; for each
item they write ``"key:seq:count"`` (``take`` to ``eosl-took``, ``batches`` to
``eosl-batched``): the n-th item of a key has count n, so a record processed twice, or
state restored out of step with the outputs, shows as a wrong or repeated line. A list
is filled across the fetched batches, and cut wherever its size says, so its records
often come from two batches, one of them read in part.

One instance per partition (``concurrency``): a list then holds the records of one
partition, whose table partition its keys belong to. The agents sleep a little now and
then, so that a test can kill the worker with transactions open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import flowkit

PARTITIONS = 4


class Item(flowkit.Record):
    key: str
    seq: int
    ts: int  # event time, ms


app = flowkit.App("eosl", partitions=PARTITIONS, commit_interval=0.3)
items = app.topic("eosl-items", value_type=Item)
took_out = app.topic("eosl-took", value_type=str)
batched_out = app.topic("eosl-batched", value_type=str)

took = app.table("eosl-took-counts", default=int)
batched = app.table("eosl-batched-counts", default=int)


@app.agent(items, sink=[took_out], concurrency=PARTITIONS)
async def take(stream: flowkit.Stream[Item]) -> AsyncIterator[str]:
    async for listed in stream.take(7, within=0.05):
        for item in listed:
            took[item.key] += 1
            yield f"{item.key}:{item.seq}:{took[item.key]}"
        await asyncio.sleep(0.02)


@app.agent(items, sink=[batched_out], concurrency=PARTITIONS)
async def batch(stream: flowkit.Stream[Item]) -> AsyncIterator[str]:
    async for listed in stream.batches(5, 0.05):
        for item in listed:
            batched[item.key] += 1
            yield f"{item.key}:{item.seq}:{batched[item.key]}"
        await asyncio.sleep(0.016)
