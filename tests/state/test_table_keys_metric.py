"""``flowkit_table_keys`` of a windowed table on ``rocksdb://`` says what the table holds,
as the same table in memory does: not only the keys changed since the last checkpoint
(which is all a tumbling table on disk keeps in memory). For every window kind, the same
records go to a table in memory and to one on disk, checkpoint after checkpoint, and
through a restart of the disk's worker; after each checkpoint the two counts agree."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker

PARTITIONS = 2


class Hit(flowkit.Record):
    user: str
    t: int  # ms


def declare(kind: str, store: str, data_dir: Path) -> tuple[flowkit.App, Any]:
    app = flowkit.App("keys", partitions=PARTITIONS, store=store, data_dir=data_dir)
    hits = app.topic("hits", value_type=Hit, key_type=str)
    table = app.table("hits", default=int)
    options: dict[str, Any] = {"grace": 0.0, "time": lambda h: h.t, "idle_timeout": None}
    if kind == "tumbling":
        windowed = table.tumbling(10.0, **options)
    elif kind == "hopping":
        windowed = table.hopping(10.0, 5.0, **options)
    elif kind == "session":
        windowed = table.session(5.0, combine=operator.add, **options)
    else:
        windowed = table.sliding(10.0, **options)

    @app.agent(hits)
    async def count(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            windowed.add(hit.user, 1)

    return app, hits


def keys(driver: TestDriver) -> list[float | None]:
    registry = driver.worker.metrics.registry
    return [
        registry.get_sample_value("flowkit_table_keys", {"table": "hits", "partition": str(p)})
        for p in range(PARTITIONS)
    ]


# Checkpoint after checkpoint: new keys, keys seen before, a window that closes.
ROUNDS = [
    [(f"u{i}", 1_000 + i) for i in range(12)],
    [(f"u{i}", 2_000 + i) for i in range(6, 20)],
    [(f"u{i}", 12_000 + i) for i in range(0, 20, 3)],
    [(f"u{i}", 13_000 + i) for i in range(25)],
]


async def run(driver: TestDriver, hits: Any, t0: int, users: list[tuple[str, int]]) -> None:
    for user, ms in users:
        await driver.send(hits, Hit(user, t0 + ms), key=user)
    await driver.run_until_idle()
    await driver.worker.checkpoint()


@pytest.mark.parametrize("kind", ["tumbling", "hopping", "session", "sliding"])
async def test_a_table_on_disk_counts_the_keys_it_holds_as_in_memory(
    kind: str, tmp_path: Path
) -> None:
    clock = FakeClock()
    t0 = int(clock.time() * 1000) - 600_000
    t0 -= t0 % 10_000
    memory_app, memory_hits = declare(kind, "memory://", tmp_path / "memory")
    disk_broker = MemoryBroker()
    async with TestDriver(memory_app, clock=clock) as memory:
        disk_app, disk_hits = declare(kind, "rocksdb://", tmp_path / "disk")
        async with TestDriver(disk_app, broker=disk_broker, clock=clock) as disk:
            for users in ROUNDS[:3]:
                await run(memory, memory_hits, t0, users)
                await run(disk, disk_hits, t0, users)
                assert keys(disk) == keys(memory), users
        # A restart opens the databases: the count is the same as before it.
        disk_app, disk_hits = declare(kind, "rocksdb://", tmp_path / "disk")
        async with TestDriver(disk_app, broker=disk_broker, clock=clock) as disk:
            await disk.run_until_idle()
            assert keys(disk) == keys(memory)
            await run(memory, memory_hits, t0, ROUNDS[3])
            await run(disk, disk_hits, t0, ROUNDS[3])
            assert keys(disk) == keys(memory)
            assert sum(k or 0 for k in keys(memory)) > 0
