"""A ``rocksdb://`` table over a kill -9 right after a checkpoint: a real worker process
(``killed_worker``), killed with SIGKILL right after a checkpoint that flushed its
databases (many changes), and right after one that left its changes in RocksDB's
write-ahead log only (a few). Either way the stamp on disk is that checkpoint's, the data
beside it exactly what the changelog held below it, and a restart has the exact counts."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowkit
from flowkit.state.databases import STAMP, open_db, open_rocksdict
from flowkit.state.local import Stamp, partition_dir
from flowkit.state.rocks import DATA
from flowkit.transports import MemoryBroker, MemoryTransport
from tests.state.killed_worker import PARTITIONS, counts_after, make_app

ROOT = Path(__file__).resolve().parents[2]

Changelog = list[list[tuple[bytes, bytes | None]]]


def killed_after(step: int, data_dir: Path, out: Path) -> Changelog:
    """Run the worker until it says it checkpointed ``step``, kill it (SIGKILL), and
    return its changelog then (per partition, in offset order)."""
    command = [sys.executable, "-m", "tests.state.killed_worker", str(data_dir), str(out)]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            for line in child.stdout:
                if line.strip() == f"checkpointed {step}":
                    break
            else:
                pytest.fail(f"the worker stopped before step {step} ({child.wait()})")
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    return [
        [(bytes.fromhex(k), None if v is None else bytes.fromhex(v)) for k, v in records]
        for records in json.loads(out.read_text())
    ]


def on_disk(data_dir: Path, partition: int) -> tuple[int, dict[bytes, bytes]]:
    """The stamp's offset and the data of one partition's database."""
    db = open_db(open_rocksdict(), partition_dir(data_dir, "killed", "counts", partition))
    try:
        stamp = Stamp.decode(db.get(STAMP)).offset
        data = {k[1:]: v for k, v in db.items(from_key=DATA) if k[:1] == DATA}
    finally:
        db.close()
    return stamp, data


async def restarted(data_dir: Path, changelog: Changelog) -> dict[str, int]:
    """The table a new worker recovers from ``data_dir`` and ``changelog``."""
    app, _, counts = make_app()
    broker = MemoryBroker(retention_records=None)
    broker.create_topic(counts.changelog_topic, PARTITIONS, compacted=True)
    for p, records in enumerate(changelog):
        for key, value in records:
            broker.append(counts.changelog_topic, value, key=key, partition=p)
    worker = flowkit.Worker(
        app, transport=MemoryTransport(broker), data_dir=data_dir, status_interval=None
    )
    async with worker:
        deadline = time.monotonic() + 30
        while not worker.ready:
            assert worker.error is None and time.monotonic() < deadline, worker.error
            await asyncio.sleep(0.01)
        return dict(worker.state.stores[counts].items())


@pytest.mark.parametrize("step", [0, 1], ids=["flushed", "in-the-log"])
async def test_a_kill_9_after_a_checkpoint_leaves_a_consistent_stamp_and_exact_counts(
    tmp_path: Path, step: int
) -> None:
    data_dir = tmp_path / "data"
    changelog = await asyncio.to_thread(killed_after, step, data_dir, tmp_path / "log.json")
    for p, records in enumerate(changelog):
        stamp, data = on_disk(data_dir, p)
        assert stamp == len(records), p  # the last checkpoint's: nothing lost
        assert data == {k: v for k, v in records if v is not None}, p
    assert await restarted(data_dir, changelog) == counts_after(step)
