"""Sliding windows for the kill -9 test: each user's hits summed over every 4 s window
Kafka Streams' ``SlidingWindows`` defines, every closed window a ``WindowResult`` on
``sl-out``. The agent sleeps a little per record so that a test can kill it while windows
are open.
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


app = flowkit.App("slidecrash", partitions=PARTITIONS, commit_interval=0.3)
hits = app.topic("sl-hits", value_type=Hit)
out = app.topic("sl-out", value_type=flowkit.WindowResult)
recent = app.table("recent").sliding(
    SIZE,
    grace=GRACE,
    aggregate=flowkit.Sum("n"),
    time=lambda hit: hit.t,
    idle_timeout=None,
    to=out,
)


@app.agent(hits)
async def visit(stream: flowkit.Stream[Hit]) -> None:
    async for hit in stream:
        recent.add(hit.user, hit)
        await asyncio.sleep(DELAY)
