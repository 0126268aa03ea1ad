"""Prints each item on stdout and relays it to an output topic, and commits only when it
stops (a commit interval of an hour): the group's committed offsets say whether the final
commit of a stop happened, and the output topic when every item was processed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import flowkit

PARTITIONS = 4


class Item(flowkit.Record):
    key: str
    seq: int


app = flowkit.App("echo", partitions=PARTITIONS, commit_interval=3600)
items = app.topic("echo-items", value_type=Item)
echoed = app.topic("echo-out", value_type=Item)


@app.agent(items, sink=[echoed])
async def echo(stream: flowkit.Stream[Item]) -> AsyncIterator[Item]:
    async for item in stream:
        print(f"item {item.seq}", flush=True)
        yield item
