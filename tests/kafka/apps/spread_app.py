"""The counts app again, for ``flowkit worker --processes N``, with a shutdown hook.

Per key, a ``Table`` remembers the sequence numbers of the items seen: read back from its
changelog, it shows every record counted twice (a repeated number) or lost (a missing one).
The shutdown hook logs one line, so a test can count the processes that stopped gracefully.
"""

from __future__ import annotations

import asyncio

import structlog

import flowkit

PARTITIONS = 4
DELAY = 0.001  # seconds per record: a process handles about 1,000 records a second

app = flowkit.App("spread", partitions=PARTITIONS, commit_interval=0.3)


class Item(flowkit.Record):
    key: str
    seq: int


items = app.topic("spread-items", value_type=Item)
seen = app.table("seen", default=list)


@app.agent(items)
async def remember(stream: flowkit.Stream[Item]) -> None:
    async for item in stream:
        seen[item.key] = [*seen[item.key], item.seq]
        await asyncio.sleep(DELAY)


@app.on_shutdown
async def said_goodbye() -> None:
    structlog.get_logger("spread").info("shutdown hook ran")
