"""Counts each key it reads, in a plain table, with standby replicas: every worker keeps
a warm copy of the partitions the others own."""

from __future__ import annotations

import flowkit

PARTITIONS = 4

app = flowkit.App("tally", partitions=PARTITIONS, commit_interval=0.3, standby_replicas=1)
keys = app.topic("tally-keys", value_type=str, external=True)
counts = app.table("counts", default=int)


@app.agent(keys)
async def count(stream: flowkit.Stream[str]) -> None:
    async for key in stream:
        counts[key] += 1
