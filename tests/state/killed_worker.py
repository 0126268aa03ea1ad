"""A worker counting keys on ``rocksdb://``, in a process of its own, for
``test_disk_kill``: it counts its input in steps on the memory broker, checkpoints after
each, writes the changelog so far to a file and then says ``checkpointed <step>`` on
stdout; the test kills it (SIGKILL) there.

    python -m tests.state.killed_worker DATA_DIR CHANGELOG_FILE
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import flowkit
from flowkit.transports import MemoryBroker, MemoryTransport

PARTITIONS = 4
# Each step counts these keys once more: many new keys (the checkpoint after it flushes
# the databases), then a few old ones (the checkpoint after it leaves them in the log).
STEPS = (range(6_000), range(400))


def make_app() -> tuple[flowkit.App, Any, Any]:
    """The counting app, its input topic and its table."""
    app = flowkit.App("killed", partitions=PARTITIONS, store="rocksdb://")
    keys = app.topic("killed-keys", value_type=str)
    counts = app.table("counts", default=int, value_type=int)

    @app.agent(keys)
    async def count(stream: flowkit.Stream[str]) -> None:
        async for key in stream:
            counts[key] += 1

    return app, keys, counts


def counts_after(step: int) -> dict[str, int]:
    """What the table holds once ``step`` is counted."""
    counts: dict[str, int] = {}
    for keys in STEPS[: step + 1]:
        for i in keys:
            counts[f"k{i}"] = counts.get(f"k{i}", 0) + 1
    return counts


async def main(data_dir: Path, out: Path) -> None:
    broker = MemoryBroker(retention_records=None)
    app, keys, counts = make_app()
    worker = flowkit.Worker(
        app,
        transport=MemoryTransport(broker),
        data_dir=data_dir,
        commit_interval=3600,  # only the checkpoints below
        status_interval=None,
    )
    async with worker:
        deadline = time.monotonic() + 60
        sent = 0
        for step, step_keys in enumerate(STEPS):
            for i in step_keys:
                raw = f"k{i}".encode()
                broker.append(keys.name, raw, key=raw)
            sent += len(step_keys)
            while not (worker.ready and worker.records_in >= sent and worker.is_idle()):
                if worker.error is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the worker did not count step {step}: {worker.error!r}")
                await asyncio.sleep(0.01)
            await worker.checkpoint()
            changelog = [
                [
                    [m.key.hex() if m.key else None, m.value.hex() if m.value else None]
                    for m in broker.messages(counts.changelog_topic, p)
                ]
                for p in range(PARTITIONS)
            ]
            aside = out.with_suffix(".tmp")
            aside.write_text(json.dumps(changelog))
            os.replace(aside, out)
            print(f"checkpointed {step}", flush=True)
        await asyncio.sleep(3600)  # killed here


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
