"""Tumbling and hopping tables on ``rocksdb://``: what the disk adds to the window suites
(which run on both stores): a restart opens the local state and replays only the
changelog's tail, local state that is not the partition's is rebuilt with one line, and
closed windows leave the disk."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

import flowkit
from flowkit.state.databases import open_db, open_rocksdict
from flowkit.state.windowed import disk
from flowkit.state.windowed.disk_owner import CloseStep, DiskOwners
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from flowkit.windows import Window, WindowResult


class Click(flowkit.Record):
    page: str
    t: int  # ms


def make_app(data_dir: Path, **options: Any) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("disk", partitions=1, store="rocksdb://", data_dir=data_dir)
    clicks = app.topic("clicks", value_type=Click)
    out = app.topic("page-counts", value_type=WindowResult)
    counts = app.table("counts", default=int).tumbling(
        10.0, grace=0.0, time=lambda c: c.t, idle_timeout=None, to=out, **options
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts[click.page] += 1

    return app, clicks, counts


CHANGELOG = "disk-counts-changelog"


def base(clock: FakeClock) -> int:
    now = int(clock.time() * 1000) - 600_000
    return now - now % 10_000


async def feed(driver: TestDriver, clicks: Any, times: list[int], pages: int = 3) -> None:
    for i, t in enumerate(times):
        page = f"/{i % pages}"
        await driver.send(clicks, Click(page, t), key=page, timestamp_ms=t)
    await driver.run_until_idle()


def results(broker: MemoryBroker) -> list[tuple[int, str, int, bool]]:
    out = []
    for m in broker.messages("page-counts", 0):
        assert m.value is not None
        r = msgspec.json.decode(m.value, type=WindowResult)
        out.append((r.start, r.key, r.value, ("flowkit.replayed", b"true") in m.headers))
    return out


def recovered(driver: TestDriver) -> tuple[int, int]:
    """(records the worker's recoveries read, partitions restored from local state)."""
    progress = driver.worker.state.recovery
    return progress.done, progress.from_local


async def test_a_restart_replays_only_the_tail_and_a_crash_only_replays_marked_results(
    tmp_path: Path,
) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base(clock)
    app, clicks, counts = make_app(tmp_path)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await feed(driver, clicks, [t0 + i for i in range(30)])  # window 1: 10 a page
        await feed(driver, clicks, [t0 + 10_000 + i for i in range(6)])  # closes it
    assert results(broker) == [(t0, f"/{k}", 10, False) for k in range(3)]

    # A clean restart: the database has everything, nothing replays.
    app, clicks, counts = make_app(tmp_path)
    driver = TestDriver(app, broker=broker, clock=clock)
    await driver.__aenter__()
    await driver.run_until_idle()
    assert recovered(driver) == (0, 1)
    assert counts.windows("/1") == {
        Window(t0, t0 + 10_000): 10,
        Window(t0 + 10_000, t0 + 20_000): 2,
    }
    await feed(driver, clicks, [t0 + 10_100 + i for i in range(3)])  # checkpointed
    await feed(driver, clicks, [t0 + 10_200 + i for i in range(3)], pages=1)
    driver.worker._error = RuntimeError("simulated crash")  # no final checkpoint
    await driver.aclose()

    # After the crash: the tail since the last checkpoint replays, not the changelog.
    app, clicks, counts = make_app(tmp_path)
    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        # (A checkpoint acknowledged but not yet written to disk, or the record that
        # says which results went out, is all there is to replay.)
        replayed, from_local = recovered(again)
        assert from_local == 1
        assert replayed < len(broker.messages(CHANGELOG, 0)) // 4
        await feed(again, clicks, [t0 + 20_000])  # closes window 2
    window2 = [r for r in results(broker) if r[0] == t0 + 10_000]
    assert sorted(window2) == [
        (t0 + 10_000, "/0", 2 + 1 + 3, False),
        (t0 + 10_000, "/1", 3, False),
        (t0 + 10_000, "/2", 3, False),
    ]


async def test_local_state_that_is_not_the_partitions_is_rebuilt_with_one_line(
    tmp_path: Path,
) -> None:
    # A plain table of the same name left its database where the windowed one looks.
    plain = flowkit.App("disk", partitions=1, store="rocksdb://", data_dir=tmp_path)
    orders = plain.topic("orders")
    totals = plain.table("counts", default=int)

    @plain.agent(orders)
    async def add(stream: flowkit.Stream[Any]) -> None:
        async for order in stream:
            totals[order] += 1

    async with TestDriver(plain, broker=MemoryBroker()) as driver:
        await driver.send(orders, "a", key="a")
        await driver.run_until_idle()

    broker, clock = MemoryBroker(), FakeClock()
    t0 = base(clock)
    app, clicks, counts = make_app(tmp_path)
    with capture_logs() as logs:
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            await feed(driver, clicks, [t0 + 1, t0 + 2, t0 + 10_001])
    refused = [e for e in logs if e["event"].startswith("local state not used")]
    assert [e["reason"] for e in refused] == ["it has format 1, not 101"]
    assert results(broker) == [(t0, "/0", 1, False), (t0, "/1", 1, False)]

    # A database that does not open: rebuilt from the changelog, with one line.
    for f in (tmp_path / "disk" / "counts" / "0").iterdir():
        if f.is_file():
            f.write_bytes(b"not a database")
    app, clicks, counts = make_app(tmp_path)
    with capture_logs() as logs:
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            await driver.run_until_idle()
            assert counts.windows("/2") == {Window(t0 + 10_000, t0 + 20_000): 1}
            assert recovered(driver)[1] == 0
    refused = [e for e in logs if e["event"].startswith("local state not used")]
    assert len(refused) == 1 and refused[0]["reason"].startswith("it does not open")


async def test_closed_windows_leave_the_disk_when_they_expire(tmp_path: Path) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base(clock)
    app, clicks, counts = make_app(tmp_path, expires=15.0)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await feed(driver, clicks, [t0 + i for i in range(9)])
        await feed(driver, clicks, [t0 + 10_000])  # closes window 1: finals stay readable
        part = driver.store(counts)._disks[0]
        assert list(part.scan(b"o")) == []  # window 1's partials: one range delete
        assert len(list(part.scan(b"c"))) == 3
        assert counts.windows("/0")[Window(t0, t0 + 10_000)] == 3
        await feed(driver, clicks, [t0 + 25_000])  # window 2 closes, window 1 expires
        assert Window(t0, t0 + 10_000) not in counts.windows("/0")
        assert counts.windows("/0")[Window(t0 + 10_000, t0 + 20_000)] == 1
        assert sorted(counts) == ["/0"]
    # On disk, after the final checkpoint: window 2's final value, window 3's partial.
    db = open_db(open_rocksdict(), tmp_path / "disk" / "counts" / "0")
    try:
        kinds = sorted((k[:1], disk.start_of(k)) for k, _ in db.items() if k[:1] in b"ocp")
    finally:
        db.close()
    assert kinds == [(b"c", t0 + 10_000), (b"p", t0 + 20_000)]


def test_a_windowed_table_on_disk_without_the_extra_says_which_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "rocksdict", None)  # as if not installed
    app = flowkit.App("disk", store="rocksdb://", data_dir=tmp_path)
    app.table("counts", default=int).hopping(10.0, 5.0)
    with pytest.raises(flowkit.ConfigurationError, match=r'pip install "flowkit\[rocksdb\]"'):
        flowkit.Worker(app)


async def test_a_window_closes_in_steps_each_a_checkpoint_of_its_own_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two keys a step: the 7 pages of the window close in 4 steps, each sent and written
    # by a checkpoint that comes at once (the commit interval is an hour, and the fake
    # clock does not move).
    monkeypatch.setattr(DiskOwners, "close_chunk", 2)
    step = DiskOwners.step
    sizes: list[int] = []

    def counted(self: DiskOwners, q: int) -> CloseStep | None:
        taken = step(self, q)
        if taken is not None:
            sizes.append(len(taken.again) + len(taken.fresh))
        return taken

    monkeypatch.setattr(DiskOwners, "step", counted)
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base(clock)
    app, clicks, counts = make_app(tmp_path)
    async with TestDriver(app, broker=broker, clock=clock, commit_interval=3600) as driver:
        await feed(driver, clicks, [t0 + i for i in range(7)], pages=7)
        await feed(driver, clicks, [t0 + 10_000])  # closes the window
        assert sorted(results(broker)) == [(t0, f"/{k}", 1, False) for k in range(7)]
        assert sizes == [2, 2, 2, 1]
        store = driver.store(counts)
        owner = store.owners.owners[0]
        assert owner.open_starts == set() and owner.closed_starts == {t0}
        assert counts.windows("/3") == {Window(t0, t0 + 10_000): 1}
