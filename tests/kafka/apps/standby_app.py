"""Counts each key it reads in two plain tables, one in memory and one in RocksDB, and in
tumbling windows of a second (in RocksDB; a key ``k<i>``'s event time is ``i`` ms), each
closed window a ``WindowResult`` on ``tally-windows``; with standby replicas: every worker
keeps a warm copy of the partitions the others own (give each worker its own
``--data-dir``: a machine each)."""

from __future__ import annotations

import flowkit

PARTITIONS = 4

app = flowkit.App("tally", partitions=PARTITIONS, commit_interval=0.3, standby_replicas=1)
keys = app.topic("tally-keys", value_type=str, external=True)
counts = app.table("counts", default=int)
disk = app.table("disk", default=int, store="rocksdb://")
closed = app.topic("tally-windows", value_type=flowkit.WindowResult)
per_second = app.table("per-second", store="rocksdb://").tumbling(
    1.0,
    grace=0,
    aggregate=flowkit.Count(),
    time=lambda key: int(key[1:]),
    idle_timeout=None,
    to=closed,
)


@app.agent(keys)
async def count(stream: flowkit.Stream[str]) -> None:
    async for key in stream:
        counts[key] += 1
        disk[key] += 1
        per_second.add(key, key)
