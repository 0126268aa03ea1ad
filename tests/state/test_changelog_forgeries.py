"""Anyone with produce rights can write a table's changelog. A record there that flowkit
did not write (not JSON, a key of no kind the table has, a source partition it does not
have, a time that is no whole number, a value of the wrong shape) must not stop the
recovery of a windowed table, a session or sliding table, or a join's buffers: a worker
that stopped on it would stop again at every restart. It is dead-lettered, and the table
recovers exactly what it would have without it.

Each case runs twice on its own broker, the same records in, one restart midway: once
with forged changelog records written before the restart, once without. The results must
be the same.
"""

from __future__ import annotations

import json
import operator
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.deadletter import DeadLetter
from flowkit.records import Message
from flowkit.state.joins import StreamJoin
from flowkit.state.joins.rocks import RocksJoinStore
from flowkit.state.windowed import SessionTable, SlidingTable
from flowkit.state.windowed.disk_store import DiskWindowedStore
from flowkit.state.windowed.session_disk_store import DiskSessionStore
from flowkit.state.windowed.sliding_disk_store import DiskSlidingStore
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from tests import test_sessions, test_sliding
from tests.conftest import ALL_CLIENTS, DriverFactory, WindowStores
from tests.hostile import hostile_json
from tests.state import test_stream_join
from tests.state.test_future_records import Click, window_app

# Records of no table's changelog: (key, value), each written to every partition.
FORGED: list[tuple[bytes | None, bytes | None]] = [
    (b"not json", b"1"),
    (b"", b"1"),
    (b"[]", b"1"),
    (b"{}", b"1"),
    (b"1", b"1"),
    (b'"w"', b"1"),
    (b"[[1]]", b"1"),
    (b"[" * 5_000 + b"]" * 5_000, b"1"),
    (b'["w"]', b'"x"'),
    (b'["w"]', b"[1, 2]"),
    (b'["w"]', b"[true, 1, 1]"),
    (b'["w", 0]', b"[1, 2, 3]"),
    (b'["s", 0]', b'"x"'),
    (b'["s", 9]', b"1"),  # a source partition the table does not have
    (b'["s", -1]', b"1"),
    (b'["s", true]', b"1"),
    (b'["p", "x", "k"]', b"1"),
    (b'["p", 0]', b"1"),
    (b'["o", 0, "k", 9]', b"1"),
    (b'["c", 0, [[1]]]', b"1"),  # a key that cannot be a table key
    (b'["e", 1]', b"1"),
    (b'["S", "a"]', b"[[1]]"),
    (b'["O", "a"]', b"[[1, 2, [[9]]]]"),
    (b'["C", "a", 1]', b"[]"),
    (b'["R", "a", 5]', b"5"),
    (b'["R", "a", "x"]', b"[1]"),
    (b'["t"]', b'"x"'),
    (b'[5, "a2V5", 1]', b'[1, false, "YQ=="]'),  # a join side that is neither 0 nor 1
    (b'[0, "a2V5", 1]', b'[1, "x", "YQ=="]'),
    (b'[0, "not base64", 1]', b'[1, false, "YQ=="]'),
    (None, b"1"),  # no key: Tansu takes one on a compacted topic
]
PARTITIONS = 2


@dataclass
class Case:
    name: str  # the table's or join's: its dead letters' agent is "table:<name>"
    changelog: str
    run: Callable[[FakeClock, MemoryBroker, int], Awaitable[list[Any]]]


async def _tumbling(clock: FakeClock, broker: MemoryBroker, half: int) -> list[Any]:
    closed: list[Any] = []
    t0 = int(clock.time() * 1000) - 600_000
    clicks = [Click(f"c{i % 3}", t0 + i * 700) for i in range(40)]
    async with TestDriver(window_app(closed), broker=broker, clock=clock) as driver:
        await _send(driver, "clicks", clicks, half)
    return closed


async def _session(clock: FakeClock, broker: MemoryBroker, half: int) -> list[Any]:
    closed: list[Any] = []
    app, hits, _ = test_sessions.session_app(closed, [], grace=5, partitions=PARTITIONS)
    t0 = test_sessions.base_ms(clock)
    events = [test_sessions.Hit(f"u{i % 3}", t0 + i * 4_000 % 90_000, i) for i in range(40)]
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await _send(driver, hits, events, half, key=lambda h: h.user)
    return closed


async def _sliding(clock: FakeClock, broker: MemoryBroker, half: int) -> list[Any]:
    closed: list[Any] = []
    app, hits, _ = test_sliding.sliding_app(closed, [], grace=4, partitions=PARTITIONS)
    t0 = test_sliding.base_ms(clock)
    events = [test_sliding.Hit(f"u{i % 3}", t0 + i * 1_500, i) for i in range(40)]
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await _send(driver, hits, events, half, key=lambda h: h.user)
    return closed


async def _join(clock: FakeClock, broker: MemoryBroker, half: int, **options: Any) -> list[Any]:
    records, _ = test_stream_join.data_set()
    app = test_stream_join.make_app("inner", **options)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        part = records[:half] if half >= 0 else records[-half:]
        for topic, key, id_, ts in part:
            await driver.send(topic, test_stream_join.Ev(id_), key=key, timestamp_ms=ts)
        await driver.run_until_idle()
        return sorted(await driver.values("paid"))


async def _send(
    driver: TestDriver, topic: Any, events: list[Any], half: int, key: Any = None
) -> None:
    # ``half`` > 0: the first ``half`` events; < 0: from ``-half`` on, then the data ends.
    part = events[:half] if half >= 0 else events[-half:]
    for i, event in enumerate(part):
        kwargs = {"key": key(event)} if key else {"partition": i % PARTITIONS}
        await driver.send(topic, event, **kwargs)
    await driver.run_until_idle()
    if half < 0:
        await driver.advance(100)  # every window closes
        await driver.run_until_idle()


_data_dirs: dict[int, Path] = {}


async def _join_on_disk(clock: FakeClock, broker: MemoryBroker, half: int) -> list[Any]:
    # The join's buffers on rocksdb://: the restart opens the first run's databases (one
    # data directory per broker, that is per run with its restart).
    data_dir = _data_dirs.setdefault(id(broker), Path(tempfile.mkdtemp(prefix="forged-")))
    try:
        return await _join(clock, broker, half, store="rocksdb://", data_dir=data_dir)
    finally:
        if half < 0:
            shutil.rmtree(_data_dirs.pop(id(broker)), ignore_errors=True)


CASES = [
    Case("counts", "win-counts-changelog", _tumbling),
    Case("visits", "sessions-visits-changelog", _session),
    Case("recent", "sliding-recent-changelog", _sliding),
    Case("paid", "joins-paid-changelog", _join),
    Case("paid", "joins-paid-changelog", _join_on_disk),
]
IDS = ["counts", "visits", "recent", "paid", "paid-rocksdb"]


async def _twice(case: Case, forged: list[tuple[bytes | None, bytes | None]]) -> tuple[Any, Any]:
    """The results of a run with a restart midway, the dead letters of its second half."""
    broker, clock = MemoryBroker(), FakeClock()
    half = 20 if case.name != "paid" else 120
    first = await case.run(clock, broker, half)
    producer = MemoryTransport(broker).producer()
    for key, value in forged:
        for p in range(PARTITIONS):
            await producer.send(case.changelog, value, key=key, partition=p)
    second = await case.run(clock, broker, -half)
    dlq = f"{_app_of(case)}-dlq"
    count = broker.partition_count(dlq) or 0
    letters = [DeadLetter(m) for p in range(count) for m in broker.messages(dlq, p)]
    return (first, second), letters


def _app_of(case: Case) -> str:
    return case.changelog.removesuffix(f"-{case.name}-changelog")


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_forged_changelog_records_are_dead_lettered_and_change_nothing(
    case: Case,
) -> None:
    want, none = await _twice(case, [])
    assert none == []
    assert want[1], "the case closes windows after the restart"
    got, letters = await _twice(case, FORGED)
    assert got == want
    assert sorted((d.message.key or b"", d.message.value or b"") for d in letters) == sorted(
        (k or b"", v or b"") for k, v in FORGED for _ in range(PARTITIONS)
    )
    assert {(d.stage, d.error_type, d.agent) for d in letters} == {
        ("decode", "DecodeError", f"table:{case.name}")
    }


@pytest.mark.parametrize("window_store", ["rocksdb"], indirect=True)
@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
async def test_forged_changelog_records_change_nothing_on_disk(
    window_store: WindowStores, case: Case
) -> None:
    # The tumbling, session and sliding cases again, their tables on rocksdb://: forged records
    # are dead-lettered from the changelog's tail as from the whole of it.
    want, _ = await _twice(case, [])
    window_store.fresh()
    got, letters = await _twice(case, FORGED)
    assert got == want
    assert len(letters) == len(FORGED) * PARTITIONS
    assert {d.agent for d in letters} == {f"table:{case.name}"}


# -- the property: any changelog bytes are applied or refused, never raised ---------------

KINDS = ["w", "p", "o", "s", "c", "e", "S", "O", "C", "R", "t", 0, 1, 5]
items = st.one_of(
    st.integers(-3, 3),
    st.integers(),
    st.text(max_size=3),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-1, 3), max_size=3),
)
shaped_keys = st.builds(
    lambda kind, rest: json.dumps([kind, *rest]).encode(),
    st.sampled_from(KINDS),
    st.lists(items, max_size=4),
)
json_values = st.recursive(items, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
values = st.none() | json_values.map(lambda v: json.dumps(v).encode()) | hostile_json
keys = shaped_keys | hostile_json | st.binary(max_size=12)
# A sliding owner's records, at any time (on disk, a time is 8 bytes of its orders).
record_keys = st.builds(
    lambda key, ts: json.dumps(["R", key, ts]).encode(),
    st.sampled_from(["a", "b", 1]),
    st.one_of(st.integers(-3, 30), st.integers(), st.sampled_from([2**62, -(2**62), 2**63])),
)


def _stores() -> list[Any]:
    app = flowkit.App("forged", partitions=PARTITIONS)
    left, right = app.topic("left"), app.topic("right")
    return [
        app.table("t", default=int).tumbling(10.0, grace=2.0),
        app.table("h", default=int).hopping(10.0, 5.0),
        app.table("s", default=list).session(5.0, combine=operator.add),
        app.table("r", default=list).sliding(10.0, grace=1.0, combine=operator.add),
        app.join(left, right, within=5.0, name="j"),
    ]


@pytest.fixture(scope="module")
def join_on_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocksJoinStore]:
    """A join's store on rocksdb://, one for every example (a database opens slowly)."""
    join = _stores()[-1]
    assert isinstance(join, StreamJoin)
    store = RocksJoinStore(
        join, lambda: 1_700_000_000_000, data_dir=tmp_path_factory.mktemp("j"), broker="m"
    )
    yield store
    store.aclose()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=st.lists(st.tuples(keys, values), min_size=1, max_size=6))
def test_any_changelog_record_is_applied_or_refused(
    records: list[tuple[bytes, bytes | None]], join_on_disk: RocksJoinStore
) -> None:
    messages = [Message("c", 0, i, 0, k, v) for i, (k, v) in enumerate(records)]
    join_on_disk.rejected = []
    for declared in [*_stores(), join_on_disk]:
        if isinstance(declared, RocksJoinStore):
            store: Any = declared  # applied on top of what earlier examples left
        else:
            store = declared.new_store(now_ms=lambda: 1_700_000_000_000)
        _applied_or_refused(store, messages)
        if isinstance(store, RocksJoinStore):
            store.persist({0: len(messages)})


def test_any_changelog_record_on_disk_is_applied_or_refused(tmp_path: Path) -> None:
    # Tumbling, hopping, session and sliding tables on rocksdb://: one database each for
    # every example (opening one takes about 50 ms), so what earlier examples applied stays.
    tumbling, hopping, session, sliding, _ = _stores()
    assert isinstance(session, SessionTable)
    assert isinstance(sliding, SlidingTable)
    stores: list[Any] = [
        DiskWindowedStore(t, lambda: 0, data_dir=tmp_path, broker="memory://")
        for t in (tumbling, hopping)
    ]
    stores.append(DiskSessionStore(session, lambda: 0, data_dir=tmp_path, broker="memory://"))
    stores.append(DiskSlidingStore(sliding, lambda: 0, data_dir=tmp_path, broker="memory://"))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(records=st.lists(st.tuples(keys | record_keys, values), min_size=1, max_size=6))
    def applied_or_refused(records: list[tuple[bytes, bytes | None]]) -> None:
        messages = [Message("c", 0, i, 0, k, v) for i, (k, v) in enumerate(records)]
        for store in stores:
            _applied_or_refused(store, messages)
            store.persist({0: len(messages)})

    try:
        applied_or_refused()
    finally:
        for store in stores:
            store.aclose()


def _applied_or_refused(store: Any, messages: list[Message]) -> None:
    store.apply_changelog(0, messages)  # never raises
    assert all(isinstance(e, flowkit.DecodeError) for _, e in store.rejected)
    # What was applied leaves a store that works: a flush of it, once more after
    # recovery, the changelog of what it holds.
    store.apply_changelog(0, [])
    if hasattr(store, "drain_changes"):
        store.drain_changes()


@pytest.mark.parametrize("make_driver", ALL_CLIENTS[1:], indirect=True)
async def test_forged_changelog_records_on_kafka_are_dead_lettered(
    make_driver: DriverFactory,
) -> None:
    # Through the broker and both clients: the records a recovery reads are Kafka's.
    clock, closed = FakeClock(), []
    t0 = int(clock.time() * 1000) - 600_000
    forged = [FORGED[0], FORGED[7], FORGED[9], FORGED[13], FORGED[19], FORGED[27]]
    async with make_driver(window_app(closed), clock=clock) as driver:
        for i in range(4):
            await driver.send("clicks", Click("c", t0 + i * 1_000), partition=i % 2)
        await driver.run_until_idle()
        acks = [
            await driver.send_raw("win-counts-changelog", value, key=key, partition=0)
            for key, value in forged
        ]
        for ack in acks:  # each written before the restart reads the changelog
            await ack
    async with make_driver(window_app(closed), clock=clock) as driver:
        for p in range(PARTITIONS):
            await driver.send("clicks", Click("c", t0 + 15_000), partition=p)
        await driver.run_until_idle()
        await driver.advance(70)
        await driver.run_until_idle()
        letters = [DeadLetter(m) for m in await driver.dead_letters()]
    assert sorted(closed) == [("c", t0, 4), ("c", t0 + 10_000, 2)]
    assert sorted((d.message.key or b"", d.message.value or b"") for d in letters) == sorted(
        (k, v or b"") for k, v in forged
    )
    assert {(d.stage, d.agent) for d in letters} == {("decode", "table:counts")}
