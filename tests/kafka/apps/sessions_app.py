"""Session windows for the kill -9 test: each user's hits summed per session, every closed
session a ``WindowResult`` on ``sc-out``. The agent sleeps a little per record so that a
test can kill it while sessions are open.
"""

from __future__ import annotations

import asyncio

import flowkit

PARTITIONS = 4
GAP = 2.0
GRACE = 3.0
DELAY = 0.001  # seconds per record: about 1,000 records a second


class Hit(flowkit.Record):
    user: str
    t: int  # event time, ms
    n: int


app = flowkit.App("sesscrash", partitions=PARTITIONS, commit_interval=0.3)
hits = app.topic("sc-hits", value_type=Hit)
out = app.topic("sc-out", value_type=flowkit.WindowResult)
visits = app.table("visits").session(
    GAP,
    grace=GRACE,
    aggregate=flowkit.Sum("n"),
    time=lambda hit: hit.t,
    idle_timeout=None,
    to=out,
)


@app.agent(hits)
async def visit(stream: flowkit.Stream[Hit]) -> None:
    async for hit in stream:
        visits.add(hit.user, hit)
        await asyncio.sleep(DELAY)
