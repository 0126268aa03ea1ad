"""The counts app (``counts_app``) with its table on local disk (``rocksdb://``); the data
directory is the worker's ``--data-dir``."""

from __future__ import annotations

import asyncio

import flowkit
from tests.kafka.apps.counts_app import PARTITIONS, Item

DELAY = 0.001  # seconds per record: about 1,000 records a second

app = flowkit.App("counts", partitions=PARTITIONS, commit_interval=0.3, store="rocksdb://")
items = app.topic("count-items", value_type=Item)
seen = app.table("seen", default=list)


@app.agent(items)
async def remember(stream: flowkit.Stream[Item]) -> None:
    async for item in stream:
        seen[item.key] = [*seen[item.key], item.seq]
        await asyncio.sleep(DELAY)
