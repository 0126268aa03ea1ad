"""Standby replicas on the memory broker: a worker follows the changelogs of the table
partitions it does not own, and a partition the group then gives it replays only the
changelog its copy had not read (the gap), with the same state as a full replay."""

from __future__ import annotations

import asyncio
import operator
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

import flowkit
from flowkit.errors import DefinitionError
from flowkit.runtime import required_topics
from flowkit.runtime.tables.keeper import StateKeeper
from flowkit.runtime.web.status import status
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from flowkit.windows import Window
from tests.state.test_table_stores import snapshot_files


class Order(flowkit.Record):
    customer: str
    amount: int


def counting_app(standby_replicas: int, store: str = "memory://") -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("shop", partitions=2, standby_replicas=standby_replicas, store=store)
    orders = app.topic("orders", value_type=Order)
    totals = app.table("totals", default=int)

    @app.agent(orders)
    async def add_up(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            totals[order.customer] += order.amount

    return app, orders, totals


async def wait_caught_up(state: StateKeeper, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while state.standbys.lag() != 0:
        assert time.monotonic() < end, f"standby lag {state.standbys.lag()} after {deadline} s"
        await asyncio.sleep(0.01)


async def _send(*_: object, **__: object) -> None:
    return None


STORES = ["memory://", "rocksdb://"]


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("standby_replicas", [0, 1])
async def test_a_takeover_replays_only_the_gap(
    standby_replicas: int, store: str, tmp_path: Path
) -> None:
    app, _, totals = counting_app(standby_replicas, store)
    transport = MemoryTransport()
    await transport.create_topics(required_topics(app))
    log = transport.broker
    for i in range(100):  # another worker owns partition 1 and writes its changelog
        log.append(totals.changelog_topic, b"%d" % i, key=b"k%d" % i, partition=1)
        if i == 50:  # and anyone may write there: records no table holds
            for value in (b"not json", b"{", b"[" * 5_000):
                log.append(totals.changelog_topic, value, key=b"forged", partition=1)
    letters: list[bytes | None] = []

    async def send(topic: str, value: bytes | None, **_: object) -> None:
        letters.append(value)

    state = StateKeeper(app, transport, FakeClock(), send, data_dir=tmp_path)
    await state.recover({0})  # this worker owns partition 0, stands by for 1
    follower = asyncio.create_task(state.standbys.run())
    try:
        if standby_replicas:
            await wait_caught_up(state)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    # Written after the copy stopped reading: the gap (two updates, a delete, a new key).
    for key, value in ((b"k1", b"-1"), (b"k2", b"-2"), (b"k3", None), (b"new", b"7")):
        log.append(totals.changelog_topic, value, key=key, partition=1)
    read, warm = state.recovery.done, state.recovery.from_standby
    await state.recover({1})
    replayed = (state.recovery.from_standby - warm, state.recovery.done - read)
    expected = {f"k{i}": i for i in range(100)} | {"k1": -1, "k2": -2, "new": 7}
    del expected["k3"]
    assert dict(state.stores[totals].items()) == expected
    assert replayed == ((1, 4) if standby_replicas else (0, 107))
    # Refused by the copy or by the replay, each dead-lettered once, by the new owner.
    assert sorted(letters) == sorted([b"not json", b"{", b"[" * 5_000])
    if store == "rocksdb://" and standby_replicas:  # the copy's database moved into place
        assert (tmp_path / "shop" / "totals" / "1").is_dir()
        assert not (tmp_path / "standby" / "shop" / "totals" / "1").exists()


async def follow_to_end(state: StateKeeper) -> None:
    """This worker owns partition 0: its copy of partition 1 reads to the end."""
    await state.recover({0})
    follower = asyncio.create_task(state.standbys.run())
    try:
        await wait_caught_up(state)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def test_a_rocksdb_copy_outlives_its_worker_and_one_past_the_end_is_rebuilt(
    tmp_path: Path,
) -> None:
    app, _, totals = counting_app(1, "rocksdb://")
    transport = MemoryTransport()
    await transport.create_topics(required_topics(app))
    for i in range(100):
        transport.broker.append(totals.changelog_topic, b"1", key=b"k%d" % i, partition=1)
    first = StateKeeper(app, transport, FakeClock(), _send, data_dir=tmp_path)
    await follow_to_end(first)
    first.aclose(clean=False)  # as a kill: the copy is on disk, stamped
    transport.broker.append(totals.changelog_topic, b"2", key=b"k0", partition=1)
    again = StateKeeper(app, transport, FakeClock(), _send, data_dir=tmp_path)
    await again.recover({0})
    # The restarted worker follows its copy on from its stamp, not from the start.
    assert list(again.standbys.positions.values()) == [100]
    again.aclose(clean=True)

    # A new broker (the same URL): the copy reflects offset 101, past the changelog's end.
    fresh = MemoryTransport()
    await fresh.create_topics(required_topics(app))
    for key in (b"a", b"b"):
        fresh.broker.append(totals.changelog_topic, b"5", key=key, partition=1)
    state = StateKeeper(app, fresh, FakeClock(), _send, data_dir=tmp_path)
    with capture_logs() as logs:
        await follow_to_end(state)
    await state.recover({1})
    assert dict(state.stores[totals].items()) == {"a": 5, "b": 5}
    said = [e for e in logs if e["event"].startswith("standby copy not used")]
    assert [e["reason"] for e in said] == ["it reflects offset 100, beyond the changelog's end"]
    state.aclose(clean=True)


@pytest.mark.parametrize("store", STORES)
async def test_workers_hand_partitions_over_warm_and_counts_stay_exact(
    store: str, tmp_path: Path
) -> None:
    broker = MemoryBroker()
    app, orders, totals = counting_app(1, store)
    customers = [f"c{k}" for k in range(20)]

    async def feed(driver: TestDriver, rounds: int) -> None:
        for _ in range(rounds):
            for c in customers:
                await driver.send(orders, Order(c, 1), key=c)
        await driver.run_until_idle()

    async with TestDriver(app, broker=broker, data_dir=tmp_path / "a") as a:
        await feed(a, 2)
        async with TestDriver(app, broker=broker, data_dir=tmp_path / "b") as b:
            for _ in range(3):  # the group gives b one partition, a keeps the other
                await a.run_until_idle()
                await b.run_until_idle()
            held = [d.store(totals).held() for d in (a, b)]
            assert held[0] and held[1] and not held[0] & held[1]
            await feed(a, 3)
            await wait_caught_up(a.worker.state)
            await wait_caught_up(b.worker.state)
            # Each follows the partition the other owns, as /status and /metrics say.
            assert status(a.worker)["standby"] == {"partitions": 1, "lag": 0}
            assert status(b.worker)["standby"] == {"partitions": 1, "lag": 0}
            scraped = generate_latest(a.worker.metrics.registry).decode()
            assert "flowkit_standby_partitions 1.0" in scraped
            assert "flowkit_standby_lag_records 0.0" in scraped
            read, warm = a.worker.state.recovery.done, a.worker.state.recovery.from_standby
            await b.aclose()  # b leaves: a owns both again
            for _ in range(3):
                await a.run_until_idle()
        assert a.store(totals).held() == {0, 1}
        # b's partition came from a's copy, caught up: nothing left to replay.
        assert a.worker.state.recovery.from_standby > warm
        assert a.worker.state.recovery.done == read
        await feed(a, 1)
        assert dict(a.store(totals).items()) == {c: 6 for c in customers}
        assert a.worker.state.standbys.partitions() == 0


async def test_a_rebalance_passes_over_every_kind_of_store() -> None:
    """A worker with a stream-stream join and a windowed table beside a plain one gives
    partitions up and takes them back (a join's store once stopped the worker there with
    AttributeError)."""
    broker = MemoryBroker()
    app, orders, totals = counting_app(1)
    refunds = app.topic("refunds", value_type=Order)
    paid = app.join(orders, refunds, within=60.0, name="refunded")
    windows = app.table("per-minute", default=int).tumbling(60.0)

    @app.agent(paid)
    async def match(stream: flowkit.Stream[flowkit.Joined]) -> None:
        async for _ in stream:
            pass

    @app.agent(orders)
    async def per_minute(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            windows[order.customer] += 1

    async with TestDriver(app, broker=broker) as a:
        for k in range(20):
            await a.send(orders, Order(f"c{k}", 1), key=f"c{k}")
        await a.run_until_idle()
        async with TestDriver(app, broker=broker) as b:
            for _ in range(3):  # a gives b a partition of each
                await a.run_until_idle()
                await b.run_until_idle()
            assert a.store(totals).held() and b.store(totals).held()
            await b.aclose()  # and takes it back
            for _ in range(3):
                await a.run_until_idle()
        assert a.worker.error is None
        assert a.store(totals).held() == {0, 1}
        assert sum(v for _, v in a.store(totals).items()) == 20


@pytest.mark.parametrize("store", STORES)
async def test_workers_trade_window_and_join_partitions_warm_and_windows_stay_exact(
    store: str, tmp_path: Path
) -> None:
    broker = MemoryBroker()
    app = flowkit.App("shop", partitions=2, standby_replicas=1, store=store)
    orders = app.topic("orders", value_type=Order)
    refunds = app.topic("refunds", value_type=Order)
    per_window = app.table("per-window", default=int).tumbling(
        10.0, grace=0, expires=600.0, idle_timeout=None
    )
    visits = app.table("visits", default=int).session(
        30.0, grace=0, expires=600.0, combine=operator.add, idle_timeout=None
    )
    recent = app.table("recent", default=int).sliding(
        10.0, grace=0, combine=operator.add, idle_timeout=None
    )
    paid = app.join(orders, refunds, within=60.0, name="refunded")
    matched: list[str] = []

    @app.agent(orders)
    async def count(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            per_window[order.customer] += order.amount
            visits.add(order.customer, order.amount)
            recent.add(order.customer, order.amount)

    @app.agent(paid)
    async def match(stream: flowkit.Stream[flowkit.Joined]) -> None:
        async for joined in stream:
            matched.append(joined.left.customer)

    customers = [f"c{k}" for k in range(12)]
    sent: list[tuple[str, int]] = []  # (customer, time ms)
    clock = [1_000_000]

    async def feed(driver: TestDriver, rounds: int) -> None:
        for _ in range(rounds):
            for c in customers:
                clock[0] += 700  # windows close as time goes on
                sent.append((c, clock[0]))
                await driver.send(orders, Order(c, 1), key=c, timestamp_ms=clock[0])
        await driver.run_until_idle()

    tables = (per_window, visits, recent, paid)
    async with TestDriver(app, broker=broker, data_dir=tmp_path / "a") as a:
        await feed(a, 3)
        async with TestDriver(app, broker=broker, data_dir=tmp_path / "b") as b:
            for _ in range(3):  # the group gives b one partition, a keeps the other
                await a.run_until_idle()
                await b.run_until_idle()
            held = [d.store(per_window).held() for d in (a, b)]
            assert held[0] and held[1] and not held[0] & held[1]
            await feed(a, 4)
            refunded = clock[0]
            await b.send(refunds, Order("c3", 1), key="c3", timestamp_ms=refunded)
            await b.run_until_idle()
            await a.run_until_idle()
            await wait_caught_up(a.worker.state)
            # a follows b's partition of every table kind, as /status says.
            assert status(a.worker)["standby"] == {"partitions": len(tables), "lag": 0}
            read, warm = a.worker.state.recovery.done, a.worker.state.recovery.from_standby
            await b.aclose()  # b leaves: a owns both again
            for _ in range(3):
                await a.run_until_idle()
        assert all(a.store(t).held() == {0, 1} for t in tables)
        # b's partitions came from a's copies, caught up: nothing left to replay (the
        # figures of the "tables recovered" line: from_standby=4, records=0).
        assert a.worker.state.recovery.from_standby - warm == len(tables)
        assert a.worker.state.recovery.done == read
        await feed(a, 2)
        assert a.worker.state.standbys.partitions() == 0
        for c in customers:
            times = [t for k, t in sent if k == c]
            want: dict[Window, int] = {}
            for t in times:
                w = Window(t - t % 10_000, t - t % 10_000 + 10_000)
                want[w] = want.get(w, 0) + 1
            assert a.store(per_window).windows(c) == want, c
            assert a.store(recent).latest(c, times[-1]) == sum(
                1 for t in times if times[-1] - 10_000 <= t
            )
            assert sum(a.store(visits).windows(c).values()) == len(times)
        # The refund pairs with every order of its customer within 60 s, once (those after
        # the takeover with the refund a's copy of the join's buffers held).
        near = [t for k, t in sent if k == "c3" and abs(t - refunded) <= 60_000]
        assert any(t > refunded for t in near)
        assert matched == ["c3"] * len(near)


def test_standby_replicas_other_than_0_or_1_are_refused_in_one_line() -> None:
    with pytest.raises(DefinitionError, match=r"standby_replicas must be 0 or 1, not int 2"):
        flowkit.App("shop", standby_replicas=2)
    with pytest.raises(DefinitionError, match=r"not bool True"):
        flowkit.Worker(flowkit.App("shop"), standby_replicas=True)


@pytest.mark.parametrize("checkpoint", ["acknowledged", "failed"])
async def test_a_revocation_after_a_failed_checkpoint_stamps_no_dict_ahead_of_its_changelog(
    checkpoint: str, tmp_path: Path
) -> None:
    # A checkpoint drains the tables' changes, then fails to send them (or, exactly-once,
    # its transaction aborts). The dicts hold those changes; the changelog does not. The
    # revocation that follows must neither snapshot them nor keep them as warm copies at
    # the changelog's offset: a restart would count their records twice.
    app, _, totals = counting_app(1)
    transport = MemoryTransport()
    await transport.create_topics(required_topics(app))

    async def send(topic: str, value: bytes | None, **_: object) -> None:
        pass

    state = StateKeeper(app, transport, FakeClock(), send, data_dir=tmp_path)
    await state.recover({0, 1})
    store = state.stores[totals]
    store.writable(0, "ann")["ann"] = 5
    state.drain_changelogs()
    if checkpoint == "acknowledged":
        state.persist()
    state.revoke({0, 1})
    snapshots = snapshot_files(tmp_path)
    copy = state.standbys.stores[totals].partition_data(0)  # followed on, or from scratch
    if checkpoint == "acknowledged":
        assert snapshots == 2 and copy == {"ann": 5}
    else:
        assert snapshots == 0 and not copy
