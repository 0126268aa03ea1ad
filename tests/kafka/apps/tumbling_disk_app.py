"""Tumbling windows on local disk (``rocksdb://``) for the kill -9 test: each user's hits
summed per 4 s window, every closed window a ``WindowResult`` on ``tu-out``; the data
directory is the worker's ``--data-dir``. The agent sleeps a little per record so that a
test can kill it while windows are open.
"""

from __future__ import annotations

import asyncio

import flowkit

PARTITIONS = 4
SIZE = 4.0
GRACE = 3.0
DELAY = 0.001  # seconds per record: about 1,000 records a second


class Hit(flowkit.Record):
    user: str
    t: int  # event time, ms
    n: int


app = flowkit.App("tumblecrash", partitions=PARTITIONS, commit_interval=0.3, store="rocksdb://")
hits = app.topic("tu-hits", value_type=Hit)
out = app.topic("tu-out", value_type=flowkit.WindowResult)
sums = app.table("sums").tumbling(
    SIZE,
    grace=GRACE,
    aggregate=flowkit.Sum("n"),
    time=lambda hit: hit.t,
    idle_timeout=None,
    to=out,
)


@app.agent(hits)
async def add(stream: flowkit.Stream[Hit]) -> None:
    async for hit in stream:
        sums.add(hit.user, hit)
        await asyncio.sleep(DELAY)
