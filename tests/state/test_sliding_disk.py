"""Sliding tables on ``rocksdb://``: what the disk adds to the sliding suites (which run on
both stores, tests/test_sliding.py): the close and expiry orders on disk, held to a plain
model through drains, persists and reopenings; a clean restart replays nothing and a
crash only the changelog's tail; local state that is not the partition's is rebuilt with
one line; memory holds only the keys touched since the last checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import flowkit
from flowkit.state.databases import open_db, open_rocksdict
from flowkit.state.local import Stamp
from flowkit.state.windowed import sliding_disk
from flowkit.state.windowed.sliding_disk import CLOSING, EXPIRING, SlidingDisk, at
from flowkit.state.windowed.sliding_disk_owner import DiskRecords
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from tests.test_sliding import SECOND, SIZE, Hit, Result, base_ms, reference

# -- the time orders, against a model ------------------------------------------------------

ops = st.lists(
    st.one_of(
        # Few keys and times: entries due together, disk and layers interleaved.
        st.tuples(st.just("add"), st.sampled_from([CLOSING, EXPIRING]), st.integers(0, 12)),
        st.tuples(st.just("drop"), st.sampled_from([CLOSING, EXPIRING]), st.integers(0, 12)),
        st.tuples(st.just("take"), st.sampled_from([CLOSING, EXPIRING]), st.integers(0, 14)),
        st.tuples(st.just("drain")),
        st.tuples(st.just("persist")),
        st.tuples(st.just("reopen")),
    ),
    max_size=40,
)


@pytest.fixture(scope="module")
def rocksdict() -> Any:
    return open_rocksdict()


def test_the_time_orders_match_a_model(rocksdict: Any, tmp_path: Path) -> None:
    stamp = Stamp(app="a", table="t", partition=0, partitions=1, broker="m", format=104)
    n = [0]

    @settings(
        max_examples=int(os.environ.get("FLOWKIT_SLIDING_DISK_EXAMPLES", "12")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(ops=ops)
    # An entry dropped (a record deleted by the changelog) is not due, whether it is in
    # the layers or on disk.
    @example(ops=[("add", CLOSING, 3), ("drop", CLOSING, 3), ("take", CLOSING, 5)])
    # Added and taken between two drains: nothing to write. Added again while on disk:
    # taking it must still delete the disk's copy.
    @example(ops=[("add", CLOSING, 3), ("take", CLOSING, 5), ("drain",), ("persist",)])
    @example(
        ops=[
            ("add", CLOSING, 3),
            ("drain",),
            ("persist",),
            ("add", CLOSING, 3),
            ("take", CLOSING, 5),
            ("drain",),
            ("persist",),
            ("reopen",),
        ]
    )
    @example(
        ops=[
            ("add", EXPIRING, 3),
            ("drain",),
            ("persist",),
            ("drop", EXPIRING, 3),
            ("take", EXPIRING, 5),
        ]
    )
    def check(ops: list[tuple[Any, ...]]) -> None:
        n[0] += 1
        path = tmp_path / str(n[0])
        path.mkdir()
        disk = SlidingDisk(rocksdict, open_db(rocksdict, path), stamp)
        # The model: the live entries, and what a reopening keeps of them (the pending
        # and drained changes in order, the persisted set).
        live: set[bytes] = set()
        pending: list[tuple[str, bytes]] = []
        draining: list[tuple[str, bytes]] = []
        persisted: set[bytes] = set()
        offset = 0
        try:
            for op in ops:
                if op[0] in ("add", "drop"):
                    entry = op[1] + at(op[2]) + b'"k"'
                    if op[0] == "add":
                        disk.add_due(entry)
                        live.add(entry)
                    else:
                        disk.drop_due(entry)
                        live.discard(entry)
                    pending.append((op[0], entry))
                elif op[0] == "take":
                    due = sorted(e for e in live if e[:1] == op[1] and e < op[1] + at(op[2]))
                    assert disk.take_due(op[1], op[2]) == due
                    live -= set(due)
                    pending.extend(("drop", e) for e in due)
                elif op[0] == "drain":
                    disk.drain()
                    draining += pending
                    pending = []
                elif op[0] == "persist":
                    offset += 1
                    disk.persist(offset)
                    for what, e in draining:
                        (persisted.add if what == "add" else persisted.discard)(e)
                    draining = []
                else:  # a crash: what was not persisted is lost
                    disk.close()
                    disk = SlidingDisk(rocksdict, open_db(rocksdict, path), stamp)
                    live = set(persisted)
                    pending, draining = [], []
                # An entry added and gone again since the last drain is in no layer: no
                # tombstone is written for what neither the disk nor the drained layer has.
                below = persisted | {e for what, e in draining if what == "add"}
                assert {k for k, v in disk.pending.items() if v is None} <= below
            for prefix in (CLOSING, EXPIRING):
                assert disk.take_due(prefix, 10**6) == sorted(e for e in live if e[:1] == prefix)
        finally:
            disk.close()

    check()


# -- a worker's restarts ------------------------------------------------------------------


def make_app(data_dir: Path, closed: list[Result]) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("slidingdisk", partitions=1, store="rocksdb://", data_dir=data_dir)
    hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)
    recent = app.table("recent", default=list).sliding(
        SIZE / 1000,
        grace=0,
        time=lambda h: h.t,
        idle_timeout=None,
        on_close=lambda k, w, v: closed.append((k, w.start, w.end, v)),
    )

    @app.agent(hits)
    async def collect(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            recent.add(hit.user, [hit.n])

    return app, hits, recent


async def feed(driver: TestDriver, hits: Any, records: list[tuple[str, int, list[int]]]) -> None:
    for user, ts, value in records:
        await driver.send(hits, Hit(user, ts, value[0]), key=user)
    await driver.run_until_idle()


def recovered(driver: TestDriver) -> tuple[int, int]:
    """(records the worker's recoveries read, partitions restored from local state)."""
    progress = driver.worker.state.recovery
    return progress.done, progress.from_local


async def test_a_clean_restart_replays_nothing_and_a_crash_only_the_tail(tmp_path: Path) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    times = [(f"u{i % 10}", t0 + (i % 7) * SECOND) for i in range(40)]
    times += [("u0", t0 + 30 * SECOND), ("u1", t0 + 31 * SECOND)]
    times += [("u1", t0 + 35 * SECOND), ("u1", t0 + 38 * SECOND), ("u2", t0 + 36 * SECOND)]
    times += [("u3", t0 + 200 * SECOND)]  # closes what is open
    records = [(user, ts, [i]) for i, (user, ts) in enumerate(times)]
    expected, _ = reference(records, SIZE, 0)
    closed: list[Result] = []
    app, hits, recent = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await feed(driver, hits, records[:42])
    before = len(closed)
    assert before > 0

    app, hits, recent = make_app(tmp_path, closed)
    driver = TestDriver(app, broker=broker, clock=clock)
    await driver.__aenter__()
    await driver.run_until_idle()
    assert recovered(driver) == (0, 1)  # a clean restart: the database has everything
    assert recent["u1"].value(t0 + 31 * SECOND) == [41]  # from disk
    await feed(driver, hits, records[42:43])
    await driver.worker.checkpoint()
    await feed(driver, hits, records[43:45])
    driver.worker._error = RuntimeError("simulated crash")  # no final checkpoint
    await driver.aclose()

    app, hits, recent = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        replayed, from_local = recovered(again)
        assert from_local == 1
        assert replayed < len(broker.messages("slidingdisk-recent-changelog", 0)) // 4
        await feed(again, hits, records[45:])
    # Every window is the reference's; only those closed after the checkpoint come twice.
    distinct = [c for i, c in enumerate(closed) if c not in closed[:i]]
    assert sorted(distinct) == expected
    assert all(c[2] >= t0 + 35 * SECOND for c in distinct if closed.count(c) > 1)


async def test_local_state_that_is_not_the_partitions_is_rebuilt_with_one_line(
    tmp_path: Path,
) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, recent = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await feed(driver, hits, [("a", t0, [0]), ("b", t0 + SECOND, [1])])
    path = tmp_path / "slidingdisk" / "recent" / "0"
    db = open_db(open_rocksdict(), path)
    db[b"\x00stamp"] = Stamp.of(recent, 0, "memory://", format=103).with_offset(2).encode()
    db.close()  # a session table's state under this name
    with capture_logs() as logs:
        app, hits, recent = make_app(tmp_path, closed)
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            await driver.run_until_idle()
            assert recovered(driver)[1] == 0
            assert recent.windows("b") == {flowkit.Window(t0 - 9000, t0 + 1000): [1]}
            assert recent["a"].value(t0 + SECOND) == [0]
            # The rebuilt close order: what closed before stays closed, the rest closes.
            await feed(driver, hits, [("c", t0 + 100 * SECOND, [2])])
    records = [("a", t0, [0]), ("b", t0 + SECOND, [1]), ("c", t0 + 100 * SECOND, [2])]
    assert sorted(closed) == reference(records, SIZE, 0)[0]
    lines = [e for e in logs if e["event"] == "local state not used; rebuilding from the changelog"]
    assert len(lines) == 1
    assert "format 103, not 104" in lines[0]["reason"]
    assert sliding_disk.FORMAT == 104


async def test_memory_holds_only_the_keys_touched_since_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    app, hits, recent = make_app(tmp_path, [])
    async with TestDriver(app, broker=broker, clock=clock, commit_interval=3600) as driver:
        base = t0 + 10 * SECOND
        await feed(driver, hits, [(f"u{i}", base + i, [i]) for i in range(200)])
        await driver.worker.checkpoint()
        owner = driver.store(recent).owners.owners[0]
        records = owner.records
        assert isinstance(records, DiskRecords)
        assert (records.cache, records.changed, owner.dirty) == ({}, set(), set())
        assert (owner.closing, owner.expiring, len(records)) == ([], [], 200)
        assert owner.young == owner.young_expiring == []  # on disk now
        disk = owner.disk
        assert (disk.pending, disk.draining) == ({}, {})
        # Records that close no window (stream time stays): the owner reads and holds
        # their two keys, not the 200.
        await feed(driver, hits, [("u7", base + 50, [7]), ("new", base + 60, [8])])
        assert records.changed == set(records.cache) == {"u7", "new"}
        assert len(records) == 201
        # (Their own windows closed already: only those just after them are to come.)
        assert sorted((e[4], e[0] - e[1]) for e in owner.young) == [
            ("new", SIZE + 1),
            ("u7", SIZE + 1),
        ]
        await driver.worker.checkpoint()
        assert (records.cache, disk.pending, disk.draining) == ({}, {}, {})
        assert owner.young == owner.young_expiring == []
