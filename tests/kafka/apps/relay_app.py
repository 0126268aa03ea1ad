"""Relays items to an output topic, remembers each key's sequence numbers in a table, and
rejects every 97th item (a dead letter): outputs, table state and dead letters all say
exactly what happened to each record. Sleeps a little per record so a test can act mid-run.
"""

from __future__ import annotations

import asyncio

import flowkit

PARTITIONS = 4
BAD_EVERY = 97


class Item(flowkit.Record):
    key: str
    seq: int


app = flowkit.App("relay", partitions=PARTITIONS, commit_interval=0.3)
items = app.topic("relay-items", value_type=Item)
relayed = app.topic("relay-out", value_type=Item)
seen = app.table("seen", default=list)


@app.agent(items, sink=[relayed])
async def relay(stream: flowkit.Stream[Item]):  # type: ignore[no-untyped-def]
    async for item in stream:
        if item.seq % BAD_EVERY == 0:
            raise ValueError(f"item {item.seq} is bad")
        seen[item.key] = [*seen[item.key], item.seq]
        await asyncio.sleep(0.0005)
        yield item
