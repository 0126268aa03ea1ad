"""A window on ``rocksdb://`` with many keys closes in chunks end to end: stage 1 ships
its partials a chunk a fetch, the owner writes those that arrive a chunk a checkpoint
(the fetcher waits for that checkpoint), and the window's keys leave stage 1's disk and
changelog a chunk a drain. What a close holds in memory is a few chunks, whatever the
window's keys; every result comes out once, exact."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

import flowkit
from flowkit.records import Message
from flowkit.state.windowed.disk_owner import DiskOwners
from flowkit.state.windowed.disk_stage1 import DiskStage1
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from flowkit.windows import WindowResult

pytest.importorskip("rocksdict")

CHUNK = 20
KEYS = 600


async def test_a_window_of_many_keys_is_held_a_few_chunks_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DiskOwners, "close_chunk", CHUNK)
    monkeypatch.setattr(DiskStage1, "chunk", CHUNK)
    held: list[int] = []  # the owner's changes waiting for a checkpoint, after each receive
    receive = DiskOwners.receive

    def receiving(self: DiskOwners, q: int, messages: Sequence[Message]) -> Any:
        out = receive(self, q, messages)
        held.append(len(self._changes))
        return out

    monkeypatch.setattr(DiskOwners, "receive", receiving)
    tombstones: list[int] = []  # stage 1's per drain
    drain = DiskStage1.drain_changes_into

    def draining(self: DiskStage1, out: list[Any]) -> None:
        before = len(out)
        drain(self, out)
        tombstones.append(
            sum(1 for _, key, value in out[before:] if value is None and key[:5] == b'["p",')
        )

    monkeypatch.setattr(DiskStage1, "drain_changes_into", draining)

    app = flowkit.App("paced", partitions=1, store="rocksdb://", data_dir=tmp_path)
    clicks = app.topic("clicks", value_type=int)
    out = app.topic("counts-out", value_type=WindowResult)
    counts = app.table("counts", default=int).tumbling(
        10.0, grace=0.0, time=lambda t: t, idle_timeout=None, to=out
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            counts[stream.current.key] += 1  # type: ignore[union-attr]

    broker, clock = MemoryBroker(), FakeClock()
    now = int(clock.time() * 1000) - 600_000
    t0 = now - now % 10_000
    # An hour between checkpoints: those that come are the ones the close asks for.
    async with TestDriver(app, broker=broker, clock=clock, commit_interval=3600) as driver:
        for i in range(KEYS):
            await driver.send(clicks, t0 + 1, key=f"k{i:04d}", timestamp_ms=t0 + 1)
        await driver.run_until_idle()
        await driver.send(clicks, t0 + 10_000, key="late", timestamp_ms=t0 + 10_000)
        await driver.run_until_idle()
        results = [
            msgspec.json.decode(m.value or b"", type=WindowResult)
            for m in broker.messages("counts-out", 0)
        ]
        assert sorted((r.key, r.value) for r in results) == [(f"k{i:04d}", 1) for i in range(KEYS)]
        assert not driver.worker.state.has_outbox()
    # Partials of one chunk in flight, one arriving, a step's changes (3 a key).
    assert max(held) <= 6 * CHUNK, max(held)
    assert 0 < max(tombstones) <= CHUNK
