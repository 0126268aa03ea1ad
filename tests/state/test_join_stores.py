"""A stream-stream join's buffers on the ``rocksdb://`` store: the same results as on the
memory store through checkpoints, clean restarts and crashes (a restart replays only the
changelog after the offset stamped on disk), and local state that is not the partition's
rebuilt from the changelog with one log line. The join's behaviour itself is tested on
both stores by tests/state/test_stream_join.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict
from structlog.testing import capture_logs

import flowkit
from flowkit.errors import LateRecord
from flowkit.records import Message
from flowkit.state.joins import JoinStore, StreamJoin
from flowkit.state.joins.disktimes import BUCKETS
from flowkit.state.joins.layout import ENDS, TIME, TOP, record_key, time_key
from flowkit.state.joins.rocks import RocksJoinStore
from flowkit.testing import TestDriver
from flowkit.topics import Topic
from flowkit.transports import MemoryBroker
from tests.state.test_stream_join import data_set, make_app, send_all, truth

T0 = 1_700_000_000_000
KEYS = [b"a", b"b", b"c"]


def declared(how: str) -> StreamJoin:
    # One partition: the store's partitions are independent, and each opens a database.
    left: Topic[int] = Topic("left", value_type=int, partitions=1)
    right: Topic[int] = Topic("right", value_type=int, partitions=1)
    return StreamJoin(left, right, name="j", app_name="t", within=0.004, grace=0.002, how=how)


class Run:
    """One join store fed record by record as the join's stream loop feeds it, with a
    changelog of its own: what each checkpoint drained, per partition."""

    def __init__(self, join: StreamJoin, data_dir: Path | None, buckets: int = BUCKETS) -> None:
        self.join = join
        self.data_dir = data_dir
        self.buckets = buckets
        self.changelog: dict[int, list[Message]] = {0: []}
        self.offsets = {(0, side): -1 for side in (0, 1)}
        self.store = self.open()

    def open(self) -> JoinStore:
        now = lambda: T0  # noqa: E731
        if self.data_dir is None:
            store = JoinStore(self.join, now)
        else:
            store = RocksJoinStore(
                self.join, now, data_dir=self.data_dir, broker="memory://", buckets=self.buckets
            )
        store.assign([0])
        return store

    def feed(
        self, p: int, side: int, key: bytes, value: int, ts: int, *, again: bool = False
    ) -> list[str]:
        if not again:
            self.offsets[p, side] += 1
        offset = self.offsets[p, side]
        part = self.store.part(p)
        raw = str(value).encode()
        try:
            results = self.store.process(part, side, key, offset, ts, raw, value) or []
        except LateRecord:
            results = ["late"]
        if part.settle:
            self.store.settle(part)
        part.high[side] = offset
        part.done = part.time
        return sorted(map(repr, results))

    def tick(self, p: int, ts: int) -> list[str]:
        """A record without key or value: its time only (as the join's stream loop)."""
        part = self.store.part(p)
        results = self.store.tick(part, ts) or []
        if part.settle:
            self.store.settle(part)
        part.done = part.time
        return sorted(map(repr, results))

    def torn(self, p: int, side: int, key: bytes, value: int, ts: int) -> list[str]:
        """A crash while a record's results are handed out: the checkpoint that ran
        meanwhile logged the record, not that it was done. It is read again."""
        offset = self.offsets[p, side] = self.offsets[p, side] + 1
        part = self.store.part(p)
        try:
            self.store.process(part, side, key, offset, ts, str(value).encode(), value)
        except LateRecord:
            pass
        self.restart(crash=True)
        return self.feed(p, side, key, value, ts, again=True)

    def drain(self) -> None:
        for p, key, value in self.store.drain_changes():
            log = self.changelog[p]
            log.append(Message("j-changelog", p, len(log), T0, key, value))

    def checkpoint(self) -> None:
        self.drain()
        self.persist()

    def persist(self) -> None:
        """Write what was drained to disk (the changelog has it)."""
        if isinstance(self.store, RocksJoinStore):
            self.store.persist({p: len(log) for p, log in self.changelog.items()})

    def restart(self, *, crash: bool) -> list[int]:
        """A new store from what is left: local state, then the changelog after it.
        Returns the changelog records replayed."""
        if crash:
            self.drain()  # the changelog has it, the local state not (no persist)
        else:
            self.checkpoint()
        if isinstance(self.store, RocksJoinStore):
            self.store.aclose()
        self.store = self.open()
        replayed = []
        for p, log in self.changelog.items():
            start = self.store.local_offset(p) if isinstance(self.store, RocksJoinStore) else None
            tail = log[start or 0 :]
            replayed.append(len(tail))
            self.store.apply_changelog(p, tail)
        return replayed


# A record: (how it is read, side, key, value, its time from the stream time's): mostly
# within the window (4 ms, grace 2 ms), some late. Or a record with no key (time only).
record = st.tuples(
    st.sampled_from(["feed", "feed", "feed", "torn"]),
    st.integers(0, 1),
    st.integers(0, 2),
    st.integers(-9, 9),
    st.integers(-8, 5),
)
step = st.one_of(
    record,
    record,
    # "drain" then "persist": a checkpoint with records processed while the changelog
    # is written.
    st.sampled_from(["checkpoint", "checkpoint", "drain", "persist", "restart", "crash"]),
    st.tuples(st.just("tick"), st.integers(1, 12)),
)


# FLOWKIT_JOIN_EXAMPLES=300 for a longer search (about a minute); 20 in CI (about 4 s).
@settings(max_examples=int(os.environ.get("FLOWKIT_JOIN_EXAMPLES", "20")), deadline=None)
@given(
    how=st.sampled_from(["inner", "left", "outer"]),
    steps=st.lists(step, max_size=50),
    # Which keys may be on disk (``DiskTimes``): one bucket for all three keys (a false
    # positive for each key another has written), two, or one each (the default).
    buckets=st.sampled_from([1, 2, BUCKETS]),
)
# Rare at random: a record on disk matched since the checkpoint does not come out
# unmatched when its window closes; a record at the edge of expiry still matches.
@example(
    how="left",
    steps=[("feed", 0, 0, 1, 0), "checkpoint", ("feed", 1, 0, 2, 2), ("tick", 7)],
    buckets=BUCKETS,
)
@example(
    how="inner",
    steps=[
        ("feed", 1, 1, 0, 0),
        ("feed", 1, 0, 1, 2),
        "checkpoint",
        ("tick", 10),
        ("feed", 0, 0, 2, -6),
    ],
    buckets=BUCKETS,
)
# A restart: the keys on disk are not known to the new store (``DiskTimes.floor``).
@example(
    how="inner",
    steps=[("feed", 0, 0, 1, 0), "checkpoint", "restart", ("feed", 1, 0, 2, 1)],
    buckets=BUCKETS,
)
# A record drained, then expired before the checkpoint wrote it: written and deleted in
# the same batch, its time key too (past the range that deletes the scans' records).
@example(
    how="left",
    steps=[("feed", 0, 0, 1, 0), "drain", ("tick", 12), "checkpoint", "restart", ("tick", 1)],
    buckets=BUCKETS,
)
# Records read between a drain and its write stay in memory; one that expired in memory
# before the write is not counted twice.
@example(
    how="inner",
    steps=[
        ("feed", 0, 0, 1, 0),
        "drain",
        ("tick", 12),
        ("feed", 1, 1, 2, 0),
        "persist",
        ("feed", 0, 1, 3, 1),
    ],
    buckets=BUCKETS,
)
# One bucket: key b may be on disk because key a is; the read finds none of b's, which
# is still matched in memory.
@example(
    how="outer",
    steps=[
        ("feed", 1, 0, 1, 0),
        "checkpoint",
        ("feed", 1, 1, 2, 1),
        ("feed", 0, 1, 3, 1),
        "checkpoint",
        ("feed", 0, 0, 4, 2),
        ("tick", 9),
    ],
    buckets=1,
)
def test_rocksdb_buffers_give_the_memory_stores_results(
    how: str, steps: list[Any], buckets: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The memory store runs without a break; the rocksdb one checkpoints (its records
    # leave memory, matched, closed and expired from disk), stops and crashes between the
    # same records, and crashes while a record's results are handed out ("torn").
    join = declared(how)
    memory = Run(join, None)
    disk = Run(join, tmp_path_factory.mktemp("join"), buckets)
    clock = T0
    for s in steps:
        if s == "checkpoint":
            disk.checkpoint()
        elif s == "drain":  # a checkpoint whose changelog writes failed: not persisted
            disk.drain()
        elif s == "persist":
            disk.persist()
        elif isinstance(s, str):
            replayed = disk.restart(crash=s == "crash")
            if s == "restart":
                assert replayed == [0]  # everything was on disk
        elif s[0] == "tick":
            clock += s[1]
            assert disk.tick(0, clock) == memory.tick(0, clock), s
        else:
            how_read, side, k, value, dt = s
            ts = clock + dt
            clock = max(clock, ts)
            feed = disk.torn if how_read == "torn" else disk.feed
            assert feed(0, side, KEYS[k], value, ts) == memory.feed(0, side, KEYS[k], value, ts), s
    # The end: every window closed, every record expired.
    assert disk.tick(0, clock + 10_000) == memory.tick(0, clock + 10_000)
    assert isinstance(disk.store, RocksJoinStore)
    # ... and deleted from disk: those in memory once written, expired by the next time.
    disk.checkpoint()
    disk.tick(0, clock + 20_000)
    disk.checkpoint()
    db = disk.store.parts[0].db
    assert [k for k in db.keys(from_key=b"r") if k not in ENDS] == []
    disk.store.aclose()


def test_records_leave_memory_at_a_checkpoint(tmp_path: Path) -> None:
    run = Run(declared("outer"), tmp_path)
    for n in range(6):
        run.feed(0, n % 2, b"a", n, T0 + n)
    part = run.store.part(0)
    entries = [e for by_key in part.buffers for es in by_key.values() for e in es]
    assert all(e[2] is not None for e in entries)  # not on disk yet
    run.checkpoint()
    assert len(entries) == 6 and all(e[2] is None and e[3] is None for e in entries)
    # Nothing of them stays in memory: no entry, nothing to close, nothing touched.
    assert part.buffers == ({}, {}) and part.late == ([], [], []) and part.touched == {}
    assert isinstance(run.store, RocksJoinStore)
    db = run.store.parts[0].db
    assert db.get(record_key(0, b"a", T0, 0)) == b"\x01" + b"0"  # matched, its value
    assert db.get(record_key(1, b"a", T0 + 5, 5)) is None  # (side, key, time, offset)
    assert db.get(record_key(1, b"a", T0 + 5, 2)) == b"\x01" + b"5"
    assert db.get(time_key(1, b"a", T0 + 5, 2)) == b"\x01"  # the time index
    # A match reads the other side's values back from disk.
    assert run.feed(0, 1, b"a", 7, T0 + 7) == [repr(flowkit.Joined("a", 4, 7, T0 + 7))]
    assert run.feed(0, 1, b"c", 8, T0 + 8) == []
    run.checkpoint()
    # Stream time moves on: the window closes and the records expire, from disk.
    assert run.feed(0, 0, b"b", 9, T0 + 15) == [repr(flowkit.Joined("c", None, 8, T0 + 8))]
    run.checkpoint()
    run.feed(0, 0, b"b", 10, T0 + 30)
    run.checkpoint()
    left = [k for k, _ in db.items(from_key=b"r") if k[:1] in (b"r", b"t") and k not in ENDS]
    assert left == [record_key(0, b"b", T0 + 30, 4), time_key(0, b"b", T0 + 30, 4)]
    run.store.aclose()


async def test_a_restart_on_rocksdb_replays_only_the_tail(tmp_path: Path) -> None:
    records, _ = data_set(seed=5)
    half = len(records) // 2
    broker = MemoryBroker()
    options = {"store": "rocksdb://", "data_dir": tmp_path}
    recoveries = []
    for chunk in (records[:half], records[half:]):
        async with TestDriver(make_app("outer", **options), broker=broker) as driver:
            await send_all(driver, chunk)
            recoveries.append(driver.worker.state.recovery)
    got = sorted(await TestDriver(make_app("outer"), broker=broker).values("paid"))
    assert got == truth(records, "outer")
    assert (recoveries[0].done, recoveries[0].from_local) == (0, 0)
    # The second run opens both partitions' databases: nothing written since (a clean
    # stop persists its last checkpoint), so nothing replays.
    assert (recoveries[1].done, recoveries[1].from_local) == (0, 2)
    assert sorted(p.name for p in (tmp_path / "joins" / "paid").iterdir()) == ["0", "1"]


@pytest.mark.parametrize("damage", ["corrupt+foreign", "unreadable", "earlier layout"])
async def test_local_state_not_this_partitions_is_rebuilt_with_one_line(
    tmp_path: Path, damage: str
) -> None:
    records, _ = data_set(seed=6)
    half = len(records) // 2
    broker = MemoryBroker()
    options = {"store": "rocksdb://", "data_dir": tmp_path}
    async with TestDriver(make_app("outer", **options), broker=broker) as driver:
        await send_all(driver, records[:half])
    part0, part1 = tmp_path / "joins" / "paid" / "0", tmp_path / "joins" / "paid" / "1"
    if damage == "unreadable":  # stamped as the partition's, holding what is not a join's
        rdict = Rdict(str(part0), Options(raw_mode=True))
        rdict[TIME] = b"not json"
        rdict.close()
    elif damage == "earlier layout":  # records without the time index, as before it
        rdict = Rdict(str(part0), Options(raw_mode=True))
        for k in [k for k, _ in rdict.items() if k[:1] == b"t" or k in (TOP, *ENDS)]:
            del rdict[k]
        rdict.close()
    else:  # partition 0's files are garbage, partition 1 has partition 0's state
        shutil.rmtree(part1)
        shutil.copytree(part0, part1)
        for f in part0.iterdir():
            if f.is_file():
                f.write_bytes(b"\x00garbage")
    with capture_logs() as logs:
        async with TestDriver(make_app("outer", **options), broker=broker) as driver:
            await send_all(driver, records[half:])
            recovery = driver.worker.state.recovery
    got = sorted(await TestDriver(make_app("outer"), broker=broker).values("paid"))
    assert got == truth(records, "outer")
    refused = {
        line["partition"]: line["reason"]
        for line in logs
        if line["event"].startswith("local state not used")
    }
    if damage != "corrupt+foreign":
        assert list(refused) == [0] and "it does not read" in refused[0], refused
        if damage == "earlier layout":
            assert "an earlier layout" in refused[0], refused
        assert recovery.from_local == 1  # partition 1's
    else:
        assert sorted(refused) == [0, 1], refused
        assert "it does not open" in refused[0] and "partition 0" in refused[1], refused
        assert recovery.from_local == 0
    assert recovery.done > 0  # the refused partitions: from the changelog
