"""One suite for every table store: ``memory://`` (with and without a data directory) and
``rocksdb://``. A table behaves the same on each; with local state, a restart replays only
the changelog after the offset the state reflects, and local state that is not this
partition's is rebuilt from the changelog with one log line."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import flowkit
from flowkit.codecs import MsgpackCodec
from flowkit.records import Message
from flowkit.rendering import render_text
from flowkit.state.rocks import RocksTableStore
from flowkit.state.snapshots import SnapshotFiles
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from tests.conftest import APACHE_KAFKA, BROKERS, DriverFactory

STORES = ["memory", "memory+snapshots", "rocksdb"]


class Order(flowkit.Record):
    customer: str
    amount: int


def orders_app(store: str, data_dir: Path, name: str = "shop") -> tuple[flowkit.App, Any, Any]:
    kind = "rocksdb://" if store == "rocksdb" else "memory://"
    keep = store != "memory"
    app = flowkit.App(name, partitions=2, store=kind, data_dir=data_dir if keep else None)
    orders = app.topic("orders", value_type=Order)
    totals = app.table("totals", default=int)

    @app.agent(orders)
    async def add_up(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            if order.amount < 0:
                del totals[order.customer]
            else:
                totals[order.customer] += order.amount

    return app, orders, totals


async def feed(driver: TestDriver, orders: Any, n: int, amount: int = 1) -> None:
    for i in range(n):
        await driver.send(orders, Order(f"c{i % 7}", amount), key=f"c{i % 7}")
    await driver.run_until_idle()


def refused(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"].startswith("local state not used")]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_table_counts_deletes_and_survives_restarts(store: str, tmp_path: Path) -> None:
    broker = MemoryBroker()
    for run in (1, 2, 3):
        app, orders, totals = orders_app(store, tmp_path)
        with capture_logs() as logs:
            async with TestDriver(app, broker=broker) as driver:
                await feed(driver, orders, 70)
                if run == 3:
                    await driver.send(orders, Order("c3", -1), key="c3")
                    await driver.run_until_idle()
                want = {f"c{k}": 10 * run for k in range(7)}
                if run == 3:
                    del want["c3"]
                assert dict(totals.items()) == want
                assert len(totals) == len(want) and sorted(totals) == sorted(want)
                assert "c3" in totals if run < 3 else "c3" not in totals
                assert totals["nobody"] == 0 and totals.get("nobody") is None
                recovery = driver.worker.state.recovery
        # With local state a restart after a clean stop replays nothing.
        assert recovery.done == (0 if store != "memory" or run == 1 else 7 * (run - 1))
        assert recovery.from_local == (2 if store != "memory" and run > 1 else 0)
        assert not refused(logs)
    changelog = await TestDriver(app, broker=broker).messages("shop-totals-changelog")
    latest = {m.key: m.value for m in changelog}
    assert latest[b"c3"] is None and json.loads(latest[b"c0"] or b"") == 30


async def test_local_state_of_another_broker_is_rebuilt_with_one_line(
    store: str, tmp_path: Path
) -> None:
    app, orders, totals = orders_app(store, tmp_path)
    async with TestDriver(app, broker=MemoryBroker()) as driver:
        await feed(driver, orders, 70)
    app, orders, totals = orders_app(store, tmp_path)
    with capture_logs() as logs:
        async with TestDriver(app, broker=MemoryBroker()) as driver:  # its changelog is empty
            await feed(driver, orders, 7)
            assert dict(totals.items()) == {f"c{k}": 1 for k in range(7)}
    if store == "memory":
        assert not refused(logs)
    else:
        assert [line["partition"] for line in refused(logs)] == [0, 1]
        assert all("beyond the changelog's end" in line["reason"] for line in refused(logs))


@pytest.mark.parametrize("store", ["memory+snapshots", "rocksdb"])
async def test_corrupt_or_foreign_local_state_is_rebuilt_from_the_changelog(
    store: str, tmp_path: Path
) -> None:
    broker = MemoryBroker()
    app, orders, totals = orders_app(store, tmp_path)
    async with TestDriver(app, broker=broker) as driver:
        await feed(driver, orders, 70)
    app, orders, totals = orders_app(store, tmp_path, name="other")
    async with TestDriver(app, broker=MemoryBroker()) as driver:
        await feed(driver, orders, 7)
    # Partition 0's local state is garbage; partition 1's is the other app's.
    part0, part1 = tmp_path / "shop" / "totals" / "0", tmp_path / "shop" / "totals" / "1"
    for f in part0.iterdir():
        if f.is_file():
            f.write_bytes(b"\x00garbage")
    shutil.rmtree(part1)
    shutil.copytree(tmp_path / "other" / "totals" / "1", part1)
    app, orders, totals = orders_app(store, tmp_path)
    with capture_logs() as logs:
        async with TestDriver(app, broker=broker) as driver:
            await feed(driver, orders, 7)
            assert dict(totals.items()) == {f"c{k}": 11 for k in range(7)}
    reasons = {line["partition"]: line["reason"] for line in refused(logs)}
    assert set(reasons) == {0, 1}, logs
    assert "'other'" in reasons[1]


def disk_stores(data_dir: Path) -> list[Any]:
    """A plain table's, a tumbling table's and a join's stores on ``rocksdb://``."""
    from flowkit.state.joins.rocks import RocksJoinStore
    from flowkit.state.windowed.disk_store import DiskWindowedStore

    app = flowkit.App("fresh", partitions=1, store="rocksdb://")
    table = app.table("t", default=int)
    windowed = app.table("w", default=int).tumbling(1.0)
    join = app.join(app.topic("l"), app.topic("r"), within=1.0, name="j")
    now = lambda: 0  # noqa: E731
    return [
        RocksTableStore(table, data_dir=data_dir, broker="memory://"),
        DiskWindowedStore(windowed, now, data_dir=data_dir, broker="memory://"),
        RocksJoinStore(join, now, data_dir=data_dir, broker="memory://"),
    ]


def test_a_partition_never_checkpointed_opens_quietly_and_unstamped_data_is_rebuilt(
    tmp_path: Path,
) -> None:
    # A worker that stops before its first checkpoint (a crash, a failing start) leaves its
    # partitions' databases fresh: nothing to rebuild, so nothing to say at the next start.
    for store in disk_stores(tmp_path):
        store.assign([0])
        store.aclose()
    for _ in range(2):
        with capture_logs() as logs:
            for store in disk_stores(tmp_path):
                store.assign([0])
                assert store.local_offset(0) is None
                store.aclose()
        assert not refused(logs), logs
    # A database that holds keys without a stamp is not one this store wrote: one line.
    from rocksdict import Options, Rdict

    for name in ("t", "w", "j"):
        rdict = Rdict(str(tmp_path / "fresh" / name / "0"), Options(raw_mode=True))
        rdict[b"dkey"] = b"1"
        rdict.close()
    with capture_logs() as logs:
        for store in disk_stores(tmp_path):
            store.assign([0])
            assert store.local_offset(0) is None
            store.aclose()
    assert [(line["table"], line["reason"]) for line in refused(logs)] == [
        (name, "it has no changelog offset") for name in ("t", "w", "j")
    ]


async def test_a_partition_that_moves_away_and_back_is_not_counted_twice(
    tmp_path: Path,
) -> None:
    broker = MemoryBroker()
    app, orders, totals = orders_app("rocksdb", tmp_path)
    async with TestDriver(app, broker=broker, data_dir=tmp_path / "a") as a:
        await feed(a, orders, 70)
        async with TestDriver(app, broker=broker, data_dir=tmp_path / "b") as b:
            for _ in range(3):  # the group gives b one partition
                await a.run_until_idle()
                await b.run_until_idle()
            held = [d.store(totals).held() for d in (a, b)]
            assert held[0] and held[1] and not held[0] & held[1]
            await feed(a, orders, 70)
        for _ in range(3):  # b left: its partition comes back to a, with b's counts
            await a.run_until_idle()
        await feed(a, orders, 70)
        assert a.store(totals).held() == {0, 1}
        assert dict(a.store(totals).items()) == {f"c{k}": 30 for k in range(7)}
        # The partition came back from a's local state plus the tail b wrote.
        assert a.worker.state.recovery.from_local == 1


def test_every_windowed_table_takes_the_disk_store() -> None:
    app = flowkit.App("shop")
    recent = app.table("w", store="rocksdb://").sliding(10.0)
    assert recent.store_kind == "rocksdb://"
    counts = app.table("counts", default=int, store="rocksdb://").tumbling(10.0)
    assert counts.store_kind == "rocksdb://"
    visits = app.table("s", store="rocksdb://").session(10.0, combine=max)
    assert visits.store_kind == "rocksdb://"
    with pytest.raises(flowkit.DefinitionError, match="store 'rocks'"):
        app.table("other", store="rocks")


def test_the_disk_store_without_the_extra_says_which_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "rocksdict", None)  # as if not installed
    app = flowkit.App("shop", store="rocksdb://", data_dir=tmp_path)
    app.table("totals", default=int)
    with pytest.raises(flowkit.ConfigurationError, match=r'pip install "flowkit\[rocksdb\]"'):
        flowkit.Worker(app)


# -- the stores themselves, against a dict ------------------------------------------------

KEYS = st.sampled_from([f"k{i}" for i in range(12)])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(-5, 5)),
        st.tuples(st.just("del"), KEYS, st.just(0)),
        st.tuples(st.just("checkpoint"), st.just(""), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=10, deadline=None)
@given(ops=OPS)
def test_a_store_reads_like_a_dict_and_its_changelog_rebuilds_it(
    ops: list[tuple[str, str, int]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    app = flowkit.App("props", partitions=2)
    table = app.table("t", default=int)
    memory = table.new_store(now_ms=lambda: 0)
    rocks = RocksTableStore(table, data_dir=tmp_path_factory.mktemp("db"), broker="memory://")
    stores = [memory, rocks]
    for s in stores:
        s.assign([0, 1])
    model: dict[str, int] = {}
    logs: list[list[Message]] = [[], []]  # what each store's changelog receives
    for op, key, value in ops:
        p = table.partition_of(key)
        if op == "set":
            model[key] = value
            for s in stores:
                s.writable(p, key)[key] = value
        elif op == "del":
            if key in model:
                del model[key]
                for s in stores:
                    del s.writable(p, key)[key]
            else:
                for s in stores:
                    with pytest.raises(KeyError):
                        del s.writable(p, key)[key]
        else:
            for i, s in enumerate(stores):
                for q, k, v in s.drain_changes():
                    logs[i].append(Message("c", q, len(logs[i]), 0, k, v))
            rocks.persist({0: len(logs[1]), 1: len(logs[1])})
        for s in stores:
            assert dict(s.items()) == model
            assert [s[k] for k in sorted(model)] == [model[k] for k in sorted(model)]
            assert all((k in s) == (k in model) for k in ("k0", "k5", "k11"))
    for i, s in enumerate(stores):  # the last changes, then a rebuild from the changelog
        for q, k, v in s.drain_changes():
            logs[i].append(Message("c", q, len(logs[i]), 0, k, v))
        rebuilt = table.new_store(now_ms=lambda: 0)
        for p in (0, 1):
            rebuilt.apply_changelog(p, [m for m in logs[i] if m.partition == p])
        assert dict(rebuilt.items()) == model
    rocks.aclose()


def test_local_state_held_by_another_process_is_never_deleted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flowkit.state import rocks

    monkeypatch.setattr(rocks, "LOCK_TRIES", 1)  # (a worker waits 2 s for the other)
    table = flowkit.App("shop", partitions=1).table("t", default=int)
    holder = RocksTableStore(table, data_dir=tmp_path, broker="memory://")
    holder.assign([0])
    holder.writable(0, "a")["a"] = 5
    holder.drain_changes()
    holder.persist({0: 1})
    other = RocksTableStore(table, data_dir=tmp_path, broker="memory://")
    with pytest.raises(flowkit.ConfigurationError, match="held by another process"):
        other.assign([0])
    holder.aclose()
    other.assign([0])
    assert other["a"] == 5 and other.local_offset(0) == 1
    other.aclose()


class Upper:
    """A codec of no msgspec kind: its values are snapshotted one by one."""

    def encode(self, value: str) -> bytes:
        return value.upper().encode()

    def decode(self, data: bytes) -> str:
        return data.decode().lower()


@pytest.mark.parametrize(
    ("key_type", "value_codec", "items"),
    [
        (str, None, {"a": 1, "b": [2, "x"], "é": {"k": None}}),  # str keys, JSON values
        (int, None, {1: Order("c", 1), -2: Order("d", 2)}),  # JSON keys too
        (bytes, MsgpackCodec(Order), {b"\x00": Order("c", 1), b"k": Order("d", 2)}),
        (Any, None, {"s": 1, b'"q"': 2, 3: 3}),  # a bytes key is written as it is
        (str, Upper(), {"a": "x", "b": "y"}),
        (str, None, {}),
    ],
)
def test_a_snapshot_loads_what_the_changelog_rebuilds(
    key_type: Any, value_codec: Any, items: dict[Any, Any], tmp_path: Path
) -> None:
    app = flowkit.App("shop", partitions=1)
    table = app.table("totals", key_type=key_type)
    if value_codec is not None:
        table.value_codec = value_codec
    store = table.new_store(now_ms=lambda: 0)
    store.assign([0])
    for key, value in items.items():
        store.writable(0, key)[key] = value
    log = [Message("c", 0, i, 0, k, v) for i, (_, k, v) in enumerate(store.drain_changes())]
    files = SnapshotFiles(tmp_path, broker="memory://")
    files.save(store, 0, offset=len(log))
    rebuilt, loaded = table.new_store(now_ms=lambda: 0), table.new_store(now_ms=lambda: 0)
    rebuilt.apply_changelog(0, log)
    with capture_logs() as logs:
        assert files.load(loaded, 0) == len(log)
    assert refused(logs) == []
    assert dict(loaded.items()) == dict(rebuilt.items())
    assert sorted(map(repr, loaded)) == sorted(map(repr, rebuilt))  # 1 == 1.0, "1" != 1


def snapshot_files(data_dir: Path) -> int:
    return len(list(data_dir.glob("shop/totals/*/snapshot.msgpack")))


async def test_memory_snapshots_at_checkpoints_survive_a_worker_that_never_stopped(
    tmp_path: Path,
) -> None:
    # A worker that is abandoned (no clean stop, no revocation) leaves the snapshot of its
    # last checkpoint: the next one loads it and replays only the changelog after it.
    broker = MemoryBroker()
    app, orders, totals = orders_app("memory+snapshots", tmp_path)
    app.snapshot_interval = 0.001
    driver = TestDriver(app, broker=broker)
    await driver.__aenter__()
    await feed(driver, orders, 70)
    await driver.worker.checkpoint()
    assert snapshot_files(tmp_path) == 2
    driver.worker.state.snapshot_interval = None  # no more of them
    await feed(driver, orders, 7)  # after the last snapshot: in the changelog only
    await driver.worker.checkpoint()
    driver.worker.state.snapshots = None  # from here on, as if the process had died
    await driver.__aexit__(None, None, None)
    app, orders, totals = orders_app("memory+snapshots", tmp_path)
    async with TestDriver(app, broker=broker) as again:
        await again.run_until_idle()
        assert dict(totals.items()) == {f"c{k}": 11 for k in range(7)}
        recovery = again.worker.state.recovery
        assert recovery.from_local == 2 and recovery.done == 7


# -- key expiry (ttl=) --------------------------------------------------------------------

T0 = 1_700_000_000_000 - 3_600_000  # an hour before the test driver's wall clock


def seen_app(store: str, data_dir: Path, **ttl: Any) -> tuple[flowkit.App, Any, Any]:
    """One partition (stream time is per partition); an order of amount < 0 only reads."""
    kind = "rocksdb://" if store == "rocksdb" else "memory://"
    keep = store != "memory"
    app = flowkit.App("shop", partitions=1, store=kind, data_dir=data_dir if keep else None)
    orders = app.topic("orders", value_type=Order)
    seen = app.table("seen", default=int, **ttl)

    @app.agent(orders)
    async def remember(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            if order.amount < 0:
                seen.get(order.customer)
            else:
                seen[order.customer] = order.amount

    return app, orders, seen


async def order_at(driver: TestDriver, orders: Any, customer: str, amount: int, at: int) -> None:
    await driver.send(orders, Order(customer, amount), key=customer, timestamp_ms=T0 + at)
    await driver.run_until_idle()
    await driver.worker.checkpoint()


async def test_keys_expire_on_stream_time_and_a_restart_does_not_bring_them_back(
    store: str, tmp_path: Path
) -> None:
    broker = MemoryBroker()
    app, orders, seen = seen_app(store, tmp_path, ttl=60)
    async with TestDriver(app, broker=broker) as driver:
        await order_at(driver, orders, "a", 1, 0)
        await order_at(driver, orders, "b", 2, 30_000)
        await order_at(driver, orders, "a", -1, 50_000)  # a read: it does not refresh "a"
        assert dict(seen.items()) == {"a": 1, "b": 2}
        await order_at(driver, orders, "c", 3, 60_000)  # "a" is due at 60 s
        assert dict(seen.items()) == {"b": 2, "c": 3} and seen["a"] == 0
        metric = driver.worker.metrics.registry.get_sample_value
        assert metric("flowkit_table_keys_expired_total", {"table": "seen"}) == 1
    changelog = await TestDriver(app, broker=broker).messages("shop-seen-changelog")
    # The tombstone is written, and every record carries its key's write time.
    assert (b"a", None, 60_000) in [(m.key, m.value, m.timestamp - T0) for m in changelog]
    assert {m.key: m.timestamp - T0 for m in changelog if m.value} == {
        b"a": 0,
        b"b": 30_000,
        b"c": 60_000,
    }
    app, orders, seen = seen_app(store, tmp_path, ttl=60)
    async with TestDriver(app, broker=broker) as driver:
        await driver.run_until_idle()
        assert dict(seen.items()) == {"b": 2, "c": 3}
        # The write times came back with the keys: "b" is due at 90 s, "c" at 120 s.
        await order_at(driver, orders, "d", 4, 90_000)
        assert dict(seen.items()) == {"c": 3, "d": 4}


async def test_a_record_from_the_far_future_is_dead_lettered_and_expires_nothing() -> None:
    app, orders, seen = seen_app("memory", Path(), ttl=60)
    async with TestDriver(app) as driver:
        await order_at(driver, orders, "a", 1, 0)
        # Two hours ahead of the wall clock (T0 is an hour behind it): a wrong clock.
        await order_at(driver, orders, "b", 2, 3 * 3_600_000)
        assert dict(seen.items()) == {"a": 1}
        [letter] = await driver.dead_letters()
        assert dict(letter.headers)["flowkit.error.type"] == b"FutureRecord"


async def test_keys_expire_on_the_wall_clock(store: str, tmp_path: Path) -> None:
    broker = MemoryBroker()
    app, orders, seen = seen_app(store, tmp_path, ttl=10, ttl_clock="wall")
    async with TestDriver(app, broker=broker) as driver:
        await order_at(driver, orders, "a", 1, 0)
        await driver.advance(6)
        await order_at(driver, orders, "b", 2, 0)
        await order_at(driver, orders, "a", -1, 0)  # a read: it does not refresh "a"
        await driver.advance(4)  # the worker's own checkpoints sweep
        assert dict(seen.items()) == {"b": 2}
    app, orders, seen = seen_app(store, tmp_path, ttl=10, ttl_clock="wall")
    async with TestDriver(app, broker=broker) as driver:  # its clock starts where the last did
        await driver.run_until_idle()
        assert dict(seen.items()) == {"b": 2}
        await driver.advance(16)
        assert dict(seen.items()) == {}


@pytest.mark.parametrize("clock", ["event", "wall"])
async def test_write_times_at_the_ends_of_int64_neither_stop_a_recovery_nor_expire_early(
    store: str, clock: str, tmp_path: Path
) -> None:
    # Anyone may write the changelog, with any timestamp Kafka takes (an int64; brokers
    # that do not bound it, as Apache Kafka 4.x does by default, store them all).
    broker = MemoryBroker()
    app, orders, seen = seen_app(store, tmp_path, ttl=10, ttl_clock=clock)
    async with TestDriver(app, broker=broker) as driver:
        await order_at(driver, orders, "a", 1, 0)
    producer = MemoryTransport(broker).producer()
    for name, ts in (("end", 2**63 - 1), ("start", -(2**63)), ("none", -1), ("far", 2**62)):
        key = name.encode()
        await producer.send("shop-seen-changelog", b"5", key=key, partition=0, timestamp_ms=ts)
    app, orders, seen = seen_app(store, tmp_path, ttl=10, ttl_clock=clock)
    async with TestDriver(app, broker=broker) as driver:
        await order_at(driver, orders, "b", 2, 1_000)
        await driver.advance(20)
        await driver.run_until_idle()
        kept = {"end": 5, "far": 5}  # written in the far future: not due for ages
        if clock == "event":  # stream time is at 1 s: "a" and "b" are live
            kept |= {"a": 1, "b": 2}
        assert dict(seen.items()) == kept
        assert await driver.dead_letters() == []


# On the test broker (Tansu); FLOWKIT_TEST_ALL_CLIENTS=1 adds Apache Kafka, whose
# timestamp rules (an hour ahead at most by default, on 4.x) the write times follow.
KAFKA = BROKERS[1:] + (APACHE_KAFKA[:1] if os.environ.get("FLOWKIT_TEST_ALL_CLIENTS") else [])


@pytest.mark.parametrize("make_driver", KAFKA, indirect=True)
async def test_write_times_and_tombstones_go_through_kafka_and_rebuild_the_store(
    make_driver: DriverFactory,
) -> None:
    # Kafka keeps the write times (the changelog records' timestamps, an hour and more in
    # the past) and the tombstones; a store rebuilt from what it returns, as a restart's
    # recovery rebuilds one, has the same keys, due at the same times.
    app, orders, seen = seen_app("memory", Path(), ttl=60)
    async with make_driver(app) as driver:
        for customer, amount, at in [("a", 1, 0), ("b", 2, 30_000), ("c", 3, 60_000)]:
            await driver.send(orders, Order(customer, amount), key=customer, timestamp_ms=T0 + at)
        await driver.run_until_idle()
        await driver.worker.checkpoint()
        assert dict(seen.items()) == {"b": 2, "c": 3}
        changelog = await driver.messages(seen.changelog_topic)
    assert [(m.key, m.value, m.timestamp - T0) for m in changelog][-1] == (b"a", None, 60_000)
    rebuilt = seen.new_store(now_ms=lambda: T0 + 3_600_000)
    rebuilt.assign([0])
    rebuilt.apply_changelog(0, changelog)
    assert dict(rebuilt.items()) == {"b": 2, "c": 3}
    rebuilt.advance(0, T0 + 90_000)
    assert [(k, v) for _, k, v, _ in rebuilt.drain_changes()] == [(b"b", None)]


@pytest.mark.parametrize("store", ["memory+snapshots", "rocksdb"])
async def test_local_state_without_write_times_is_rebuilt_when_a_ttl_is_added(
    store: str, tmp_path: Path
) -> None:
    broker = MemoryBroker()
    app, orders, seen = seen_app(store, tmp_path)
    async with TestDriver(app, broker=broker) as driver:
        await order_at(driver, orders, "a", 1, 0)
    # Its records count from their own timestamps: the time they were sent.
    [record] = await TestDriver(app, broker=broker).messages("shop-seen-changelog")
    sent = record.timestamp - T0
    app, orders, seen = seen_app(store, tmp_path, ttl=60)
    with capture_logs() as logs:
        clock = FakeClock(start=record.timestamp / 1000)
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            await driver.run_until_idle()
            assert dict(seen.items()) == {"a": 1}  # the old changelog reads as it is
            await order_at(driver, orders, "b", 2, sent + 59_999)
            assert dict(seen.items()) == {"a": 1, "b": 2}
            await order_at(driver, orders, "b", 2, sent + 60_000)
            assert dict(seen.items()) == {"b": 2}
    assert ["no write times" in line["reason"] for line in refused(logs)] == [True]


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        ({"ttl": 0}, "ttl must be more than 0 seconds, not 0"),
        ({"ttl": -5}, "ttl must be more than 0 seconds, not -5"),
        ({"ttl": "7d"}, "ttl must be seconds (a number or timedelta), not str '7d'"),
        ({"ttl": True}, "ttl must be seconds (a number or timedelta), not bool True"),
        ({"ttl": float("inf")}, "ttl must be more than 0 seconds, not inf"),
        ({"ttl": 60, "ttl_clock": "processing"}, "ttl_clock must be 'event' or 'wall'"),
        ({"ttl_clock": "wall"}, "ttl_clock= needs a ttl="),
    ],
)
def test_a_bad_ttl_is_one_line_at_declaration(ttl: dict[str, Any], error: str) -> None:
    app = flowkit.App("shop")
    with pytest.raises(flowkit.DefinitionError) as caught:
        app.table("seen", **ttl)
    assert error in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("table 'seen': ")


def test_the_ttl_is_shown_and_windowed_tables_refuse_it() -> None:
    from datetime import timedelta

    app = flowkit.App("shop")
    seen = app.table("seen", ttl=timedelta(days=7))
    assert seen.describe()["ttl"] == "604800s (event time)"
    assert "ttl 604800s (event time)" in render_text(app.graph())
    with pytest.raises(flowkit.DefinitionError, match="windows expire with expires="):
        app.table("counts", default=int, ttl=60).tumbling(10.0)


TIMED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(0, 30)),  # at stream time + 0..30 s
        st.tuples(st.just("del"), KEYS, st.just(0)),
        st.tuples(st.just("late"), KEYS, st.integers(0, 90)),  # a write 0..90 s ago
        st.tuples(st.just("advance"), st.just(""), st.integers(0, 40)),
        st.tuples(st.just("checkpoint"), st.just(""), st.just(0)),
    ),
    max_size=40,
)


# Each example opens two RocksDB databases: FLOWKIT_TEST_EXAMPLES=500 for a longer search.
@settings(max_examples=int(os.environ.get("FLOWKIT_TEST_EXAMPLES", "5")), deadline=None)
@given(ops=TIMED_OPS)
def test_a_store_with_a_ttl_expires_like_a_dict_model(
    ops: list[tuple[str, str, int]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    ttl = 60_000
    app = flowkit.App("props", partitions=2)
    table = app.table("t", default=int, ttl=60)
    memory = table.new_store(now_ms=lambda: 0)
    rocks = RocksTableStore(table, data_dir=tmp_path_factory.mktemp("db"), broker="memory://")
    stores = [memory, rocks]
    for s in stores:
        s.assign([0, 1])
        s.advance(0, T0)
        s.advance(1, T0)
    model: dict[str, tuple[int, int]] = {}  # key -> (value, write time)
    clock = [T0, T0]  # stream time per partition
    logs: list[list[Message]] = [[], []]

    def checkpoint() -> None:
        for p in (0, 1):
            for key in [k for k, (_, at) in model.items() if table.partition_of(k) == p]:
                if model[key][1] + ttl <= clock[p]:
                    del model[key]
        for i, s in enumerate(stores):
            for q, k, v, at in s.drain_changes():
                logs[i].append(Message("c", q, len(logs[i]), at, k, v))
        rocks.persist({0: len(logs[1]), 1: len(logs[1])})

    for op, key, n in ops:
        p = table.partition_of(key)
        if op in ("set", "late"):
            at = clock[p] + n * 1000 if op == "set" else clock[p] - n * 1000
            clock[p] = max(clock[p], at)
            model[key] = (n, at)
            for s in stores:
                s.writable(p, key)[key] = n
                s.touch(p, key, at)
        elif op == "del" and key in model:
            del model[key]
            for s in stores:
                del s.writable(p, key)[key]
                s.touch(p, key, None)
        elif op == "advance":
            clock = [c + n * 1000 for c in clock]
            for s in stores:
                for q in (0, 1):
                    s.advance(q, clock[q])
        elif op == "checkpoint":
            checkpoint()
        for s in stores:  # reads between checkpoints see what the last one left
            assert dict(s.items()) == {k: v for k, (v, _) in model.items()}
    checkpoint()
    for i in range(2):  # a rebuild from either changelog: the same keys, due at the same time
        rebuilt = table.new_store(now_ms=lambda: 0)
        for p in (0, 1):
            rebuilt.apply_changelog(p, [m for m in logs[i] if m.partition == p])
            rebuilt.advance(p, clock[p] + ttl)
        assert dict(rebuilt.items()) == {k: v for k, (v, _) in model.items()}
        assert {(p, k) for p, k, v, _ in rebuilt.drain_changes()} == {
            (table.partition_of(k), table.encode_key(k)) for k in model
        }
    rocks.aclose()
