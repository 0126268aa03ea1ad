"""Remembers, per key, the sequence numbers of the items it has seen, in a ``Table``.

A record counted twice shows up as a repeated number, a lost one as a missing number, so
the final table (read back from its changelog) says exactly what happened to each record.
The agent sleeps a little per record so that a test can stop or kill it mid-run.
"""

from __future__ import annotations

import asyncio

import flowkit

PARTITIONS = 4
DELAY = 0.001  # seconds per record: about 1,000 records a second


class Item(flowkit.Record):
    key: str
    seq: int


app = flowkit.App("counts", partitions=PARTITIONS, commit_interval=0.3)
items = app.topic("count-items", value_type=Item)
seen = app.table("seen", default=list)


@app.agent(items)
async def remember(stream: flowkit.Stream[Item]) -> None:
    async for item in stream:
        seen[item.key] = [*seen[item.key], item.seq]
        await asyncio.sleep(DELAY)
