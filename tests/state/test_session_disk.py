"""Session tables on ``rocksdb://``: what the disk adds to the session suites (which run on
both stores, tests/test_sessions.py): the closed sessions' expiry order on disk, held to a
plain model through drains, persists and reopenings; a clean restart replays nothing and
a crash only the changelog's tail; local state that is not the partition's is rebuilt
with one line; expired sessions leave the disk."""

from __future__ import annotations

import operator
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
from flowkit.state.windowed import session_disk
from flowkit.state.windowed.session_disk import CLOSED, EXPIRY, SessionDisk
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from tests.test_sessions import GAP, SECOND, Hit, Result, base_ms

# -- the expiry order, against a model ----------------------------------------------------

ops = st.lists(
    st.one_of(
        # Few keys and times: sessions that expire together, disk and layers interleaved.
        st.tuples(st.just("keep"), st.sampled_from(["a", "b"]), st.integers(0, 12)),
        st.tuples(st.just("expire"), st.integers(0, 14)),
        st.tuples(st.just("drain")),
        st.tuples(st.just("persist")),
        st.tuples(st.just("reopen")),
    ),
    max_size=40,
)


@pytest.fixture(scope="module")
def rocksdict() -> Any:
    return open_rocksdict()


def test_the_expiry_order_matches_a_model(rocksdict: Any, tmp_path: Path) -> None:
    # One database for every example (it opens slowly): each example's keys are its own.
    stamp = Stamp(app="a", table="t", partition=0, partitions=1, broker="m", format=103)
    n = [0]

    @settings(
        max_examples=int(os.environ.get("FLOWKIT_SESSION_DISK_EXAMPLES", "25")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(ops=ops)
    # A session kept after the disk's order was read past where it ends: on disk, it is
    # found all the same.
    @example(
        ops=[
            *[("keep", "a", 5), ("drain",), ("persist",), ("expire", 10)],
            *[("keep", "b", 3), ("drain",), ("persist",)],
        ]
    )
    def check(ops: list[tuple[Any, ...]]) -> None:
        n[0] += 1
        path = tmp_path / str(n[0])
        path.mkdir()
        disk = SessionDisk(rocksdict, open_db(rocksdict, path), stamp)
        # The model: sessions kept and not yet expired (key, start, end); which of them
        # are drained and persisted, to know what a reopening keeps.
        live: set[tuple[bytes, int, int]] = set()
        pending: list[tuple[str, Any]] = []
        draining: list[tuple[str, Any]] = []
        persisted: set[tuple[bytes, int, int]] = set()
        starts: dict[tuple[bytes, int], int] = {}
        offset = 0
        try:
            for op in ops:
                if op[0] == "keep":
                    kj, end = f'"{op[1]}"'.encode(), op[2]
                    start = end - starts.setdefault((kj, end), 0)
                    starts[kj, end] += 1  # one session of a key per (start, end)
                    if (kj, start, end) in live:
                        continue
                    disk.keep_closed(kj, start, end, b"[0,0,0]")
                    live.add((kj, start, end))
                    pending.append(("add", (kj, start, end)))
                elif op[0] == "expire":
                    due = {s for s in live if s[2] < op[1]}
                    got = disk.expire(op[1])
                    assert {(kj, st) for kj, sts in got.items() for st in sts} == {
                        (kj, st) for kj, st, _ in due
                    }
                    live -= due
                    pending.extend(("del", s) for s in due)
                elif op[0] == "drain":
                    disk.drain()
                    draining += pending
                    pending = []
                elif op[0] == "persist":
                    offset += 1
                    disk.persist(offset)
                    for what, s in draining:
                        (persisted.add if what == "add" else persisted.discard)(s)
                    draining = []
                else:  # a crash: what was not persisted is lost
                    disk.close()
                    disk = SessionDisk(rocksdict, open_db(rocksdict, path), stamp)
                    live = set(persisted)
                    pending, draining = [], []
            assert disk.expire(10**6) == _by_key(live)
        finally:
            disk.close()

    check()


def _by_key(sessions: set[tuple[bytes, int, int]]) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for kj, start, _ in sorted(sessions, key=lambda s: (s[2], s[1], s[0])):
        out.setdefault(kj, []).append(start)
    return out


# -- a worker's restarts ------------------------------------------------------------------


def make_app(data_dir: Path, closed: list[Result], **options: Any) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("sessions", partitions=1, store="rocksdb://", data_dir=data_dir, **options)
    hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)
    visits = app.table("visits", default=list).session(
        GAP / 1000,
        grace=0,
        expires=GAP * 6 / 1000,
        combine=operator.add,
        time=lambda h: h.t,
        idle_timeout=None,
        on_close=lambda k, w, v: closed.append((k, w.start, w.end, v)),
    )

    @app.agent(hits)
    async def visit(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            visits.add(hit.user, [hit.n])

    return app, hits, visits


async def feed(driver: TestDriver, hits: Any, t0: int, times: list[tuple[str, int]]) -> None:
    for i, (user, s) in enumerate(times):
        await driver.send(hits, Hit(user, t0 + s * SECOND, i), key=user)
    await driver.run_until_idle()


def recovered(driver: TestDriver) -> tuple[int, int]:
    """(records the worker's recoveries read, partitions restored from local state)."""
    progress = driver.worker.state.recovery
    return progress.done, progress.from_local


async def test_a_clean_restart_replays_nothing_and_a_crash_only_the_tail(tmp_path: Path) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, visits = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        # u0..u9 one session each at 0-5 s, closed by the records at 30 s.
        await feed(driver, hits, t0, [(f"u{i % 10}", i % 6) for i in range(30)])
        await feed(driver, hits, t0, [("u0", 30), ("u1", 31)])
    assert len(closed) == 10

    app, hits, visits = make_app(tmp_path, closed)
    driver = TestDriver(app, broker=broker, clock=clock)
    await driver.__aenter__()
    await driver.run_until_idle()
    assert recovered(driver) == (0, 1)  # a clean restart: the database has everything
    assert visits.windows("u1") == {  # a closed session (disk), an open one (memory)
        flowkit.Window(t0 + 1000, t0 + 5000): [1, 11, 21],
        flowkit.Window(t0 + 31_000, t0 + 31_000): [1],
    }
    await feed(driver, hits, t0, [("u1", 35)])
    await driver.worker.checkpoint()
    await feed(driver, hits, t0, [("u1", 38), ("u2", 36)])
    driver.worker._error = RuntimeError("simulated crash")  # no final checkpoint
    await driver.aclose()

    app, hits, visits = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        replayed, from_local = recovered(again)
        assert from_local == 1
        assert replayed < len(broker.messages("sessions-visits-changelog", 0)) // 4
        await feed(again, hits, t0, [("u3", 200)])  # closes what is open
    assert sorted(closed[10:]) == [
        ("u0", t0 + 30_000, t0 + 30_000, [0]),
        ("u1", t0 + 31_000, t0 + 38_000, [1, 0, 0]),
        ("u2", t0 + 36_000, t0 + 36_000, [1]),
    ]


async def test_local_state_that_is_not_the_partitions_is_rebuilt_with_one_line(
    tmp_path: Path,
) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, visits = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await feed(driver, hits, t0, [("a", 0), ("b", 1), ("a", 30)])
    path = tmp_path / "sessions" / "visits" / "0"
    db = open_db(open_rocksdict(), path)
    db[b"\x00stamp"] = Stamp.of(visits, 0, "memory://", format=101).with_offset(2).encode()
    db.close()  # a tumbling table's state under this name
    with capture_logs() as logs:
        app, hits, visits = make_app(tmp_path, closed)
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            await driver.run_until_idle()
            assert recovered(driver)[1] == 0
            assert visits.windows("b") == {flowkit.Window(t0 + 1000, t0 + 1000): [1]}
            assert visits.windows("a")[flowkit.Window(t0, t0)] == [0]
    lines = [e for e in logs if e["event"] == "local state not used; rebuilding from the changelog"]
    assert len(lines) == 1
    assert "format 101, not 103" in lines[0]["reason"]
    assert session_disk.FORMAT == 103


async def test_expired_sessions_leave_the_disk(tmp_path: Path) -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, visits = make_app(tmp_path, closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await feed(driver, hits, t0, [(f"u{i}", i) for i in range(20)])
        await feed(driver, hits, t0, [("z", 40)])  # closes the twenty
        assert len(closed) == 20
        assert visits.windows("u3") == {flowkit.Window(t0 + 3000, t0 + 3000): [3]}
        store = driver.store(visits)
        assert len(list(store.owners.closed_keys(store.owners.owners[0]))) == 20
        await driver.worker.checkpoint()  # on disk
        await feed(driver, hits, t0, [("z", 200)])  # past their expiry (60 s), and z's
        assert visits.windows("u3") == {}
    db = open_db(open_rocksdict(), tmp_path / "sessions" / "visits" / "0")
    try:
        left = [k for k, _ in db.items() if k[:1] in (CLOSED, EXPIRY)]
    finally:
        db.close()
    assert left == []
