"""Tables, global tables, joins, group_by and windowed tables, end to end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import flowkit
from flowkit.streams import StreamSource
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from tests.conftest import ALL_CLIENTS, DriverFactory


class Order(flowkit.Record):
    customer: str
    amount: int


class Click(flowkit.Record):
    user: str
    campaign: str
    t: int


def orders_app(name: str = "shop") -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App(name, partitions=4)
    orders = app.topic("orders", value_type=Order)
    totals = app.table("totals", default=int)

    @app.agent(orders)
    async def add_up(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            totals[order.customer] += order.amount

    return app, orders, totals


@pytest.mark.parametrize("make_driver", ALL_CLIENTS, indirect=True)
async def test_table_counts_and_survives_a_restart(make_driver: DriverFactory) -> None:
    app, orders, totals = orders_app()
    async with make_driver(app) as driver:
        for i in range(40):
            await driver.send(orders, Order(f"c{i % 5}", i), key=f"c{i % 5}")
        await driver.run_until_idle()
        assert dict(totals.items()) == {f"c{k}": sum(range(k, 40, 5)) for k in range(5)}
        assert totals["nobody"] == 0 and "nobody" not in totals
    # A new app instance on the same broker rebuilds the table from its changelog.
    app, orders, totals = orders_app()
    async with make_driver(app) as driver:
        await driver.send(orders, Order("c0", 1000), key="c0")
        await driver.run_until_idle()
        assert totals["c0"] == sum(range(0, 40, 5)) + 1000
        assert len(totals) == 5
    # The stop flushed the changelog; read it with a driver that is not started.
    changelog = await make_driver(app).messages("shop-totals-changelog")
    # Latest value per key once per checkpoint, not one record per update.
    assert len(changelog) <= 5 + 1 + 5
    latest = {m.key: json.loads(m.value) for m in changelog if m.value is not None}
    assert latest[b"c0"] == sum(range(0, 40, 5)) + 1000


async def test_writing_a_key_off_its_partition_stops_the_worker() -> None:
    app = flowkit.App("bad", partitions=4)
    clicks = app.topic("clicks", value_type=Click)
    per_campaign = app.table("per-campaign", default=int)

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            per_campaign[click.campaign] += 1

    async with TestDriver(app) as driver:
        for i in range(20):
            await driver.send(clicks, Click(f"u{i}", f"camp{i}", 0), key=f"u{i}")
        with pytest.raises(flowkit.DefinitionError, match="group_by"):
            await driver.run_until_idle()


async def test_group_by_moves_records_to_the_key_owner(make_driver: DriverFactory) -> None:
    app = flowkit.App("gb", partitions=4)
    clicks = app.topic("clicks", value_type=Click)
    per_campaign = app.table("per-campaign", default=int)
    by_campaign = clicks.group_by(lambda c: c.campaign, name="by-campaign")

    @app.agent(by_campaign)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            per_campaign[click.campaign] += 1

    assert by_campaign.name == "gb-by-campaign-repartition"
    async with make_driver(app) as driver:
        for i in range(60):
            await driver.send(clicks, Click(f"u{i}", f"camp{i % 6}", 0), key=f"u{i}")
        await driver.run_until_idle()
        assert dict(per_campaign.items()) == {f"camp{k}": 10 for k in range(6)}
        rekeyed = await driver.messages(by_campaign)
    assert len(rekeyed) == 60
    for m in rekeyed:
        assert m.partition == per_campaign.partition_of(m.key.decode())


CAMPAIGN_OF = {"ad1": "camp-a", "ad2": "camp-a", "ad3": "camp-b"}


class View(flowkit.Record):
    ad: str
    t: int


@pytest.mark.parametrize("missing", ["skip", "none", "error"])
async def test_global_table_join(make_driver: DriverFactory, missing: str) -> None:
    app = flowkit.App("gt", partitions=2)
    views = app.topic("views", value_type=View)
    campaigns = app.global_table("campaigns", value_type=str, loader=CAMPAIGN_OF.items)
    seen: list[tuple[str, str | None]] = []

    @app.agent(views)
    async def join(stream: flowkit.Stream[View]) -> None:
        async for view, campaign in stream.join(campaigns, on=lambda v: v.ad, missing=missing):
            seen.append((view.ad, campaign))

    async with make_driver(app) as driver:
        assert dict(campaigns.items()) == CAMPAIGN_OF  # loaded before any record
        for ad in ("ad1", "ad3", "nope", "ad2"):
            await driver.send(views, View(ad, 0), partition=0)
        await driver.run_until_idle()
        dead = await driver.dead_letters()
    expected = [("ad1", "camp-a"), ("ad3", "camp-b"), ("ad2", "camp-a")]
    if missing == "none":
        expected.insert(2, ("nope", None))
    assert seen == expected
    assert len(dead) == (1 if missing == "error" else 0)


async def test_join_on_a_field_name() -> None:
    app = flowkit.App("gt-field", partitions=2)
    views = app.topic("views", value_type=View)
    campaigns = app.global_table("campaigns", value_type=str, loader=CAMPAIGN_OF.items)
    seen: list[tuple[str, str]] = []

    @app.agent(views)
    async def join(stream: flowkit.Stream[View]) -> None:
        async for view, campaign in stream.join(campaigns, on="ad"):
            seen.append((view.ad, campaign))

    async with TestDriver(app) as driver:
        for ad in ("ad3", "nope", "ad1"):
            await driver.send(views, View(ad, 0), partition=1)
        await driver.run_until_idle()
    assert seen == [("ad3", "camp-b"), ("ad1", "camp-a")]
    with pytest.raises(flowkit.DefinitionError, match="field name"):
        flowkit.Stream(StreamSource("s"), ()).join(campaigns, on="ad-id")


async def test_join_then_events_keeps_each_record_envelope() -> None:
    app = flowkit.App("gt-events")
    views = app.topic("views", value_type=View)
    campaigns = app.global_table("campaigns", value_type=str, loader=CAMPAIGN_OF.items)
    seen: list[tuple[int, str, str]] = []

    @app.agent(views)
    async def join(stream: flowkit.Stream[View]) -> None:
        async for event in stream.join(campaigns, on="ad").events():
            view, campaign = event.value
            seen.append((event.offset, view.ad, campaign))

    async with TestDriver(app) as driver:
        for ad in ("ad1", "nope", "ad3"):
            await driver.send(views, View(ad, 0))
        await driver.run_until_idle()
    assert seen == [(0, "ad1", "camp-a"), (2, "ad3", "camp-b")]


async def test_a_per_record_agent_reads_a_global_table_by_key() -> None:
    """``campaigns[ad]`` in a per-record agent: the value, the table's default for a
    missing key, or (without a default) a KeyError that dead-letters the record."""
    app = flowkit.App("gt-read", partitions=2)
    views = app.topic("views", value_type=View)
    campaigns = app.global_table("campaigns", value_type=str, loader=CAMPAIGN_OF.items)
    named = app.global_table("named", value_type=str, default=lambda: "?", loader=list)
    seen: list[tuple[str, str]] = []
    with pytest.raises(flowkit.NotRunningError, match="table 'campaigns'"):
        campaigns["ad1"]  # no worker

    @app.agent(views, per_record=True)
    def look_up(view: View) -> None:
        seen.append((named[view.ad], campaigns[view.ad]))

    async with TestDriver(app) as driver:
        for ad in ("ad1", "nope", "ad3"):
            await driver.send(views, View(ad, 0), partition=1)
        await driver.run_until_idle()
        dead = await driver.dead_letters()
    assert seen == [("?", "camp-a"), ("?", "camp-b")]
    assert [dict(d.headers)["flowkit.source.offset"] for d in dead] == [b"1"]
    assert dict(dead[0].headers)["flowkit.error.type"] == b"KeyError"


async def test_global_table_follows_updates_and_loader_runs_once(
    make_driver: DriverFactory,
) -> None:
    def build() -> tuple[flowkit.App, Any]:
        app = flowkit.App("gt2")
        campaigns = app.global_table("campaigns", value_type=str, loader=CAMPAIGN_OF.items)

        @app.task
        async def rename() -> None:
            await campaigns.put("ad9", "camp-z")

        return app, campaigns

    app, campaigns = build()
    async with make_driver(app) as driver:
        await driver.run_until_idle()
        for _ in range(200):
            if "ad9" in campaigns:
                break
            await driver.advance(0.01)
            await __import__("asyncio").sleep(0.01)
        assert campaigns["ad9"] == "camp-z"
    app, campaigns = build()
    async with make_driver(app) as driver:
        assert len(await driver.messages("campaigns")) >= 4  # loader did not run again
        assert len([m for m in await driver.messages("campaigns") if m.key == b"ad1"]) == 1


def window_app(closed: list[tuple[str, int, int]], **options: Any) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("win", partitions=2)
    clicks = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).tumbling(
        10.0,
        grace=2.0,
        time=lambda c: c.t,
        on_close=lambda key, window, value: closed.append((key, window.start, value)),
        **options,
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts[click.campaign] += 1

    return app, clicks, counts


def base_ms(clock: FakeClock) -> int:
    t = int(clock.time() * 1000) - 600_000
    return t - t % 10_000


async def test_windows_close_once_with_their_final_value(make_driver: DriverFactory) -> None:
    clock = FakeClock()
    closed: list[tuple[str, int, int]] = []
    app, clicks, counts = window_app(closed)
    t0 = base_ms(clock)
    async with make_driver(app, clock=clock) as driver:
        for i in range(30):  # 3 windows x 10 clicks; both partitions see every window
            await driver.send(clicks, Click("u", "c", t0 + i * 1000), partition=i % 2)
        await driver.run_until_idle()
        # Windows 1 and 2 closed everywhere (watermark = 29 s - 2 s); window 3 is open.
        assert sorted(closed) == [("c", t0, 10), ("c", t0 + 10_000, 10)]
        assert counts.windows("c")[flowkit.Window(t0 + 20_000, t0 + 30_000)] == 10
        assert counts.value("c", t0 + 10_005) == 10  # closed, readable until it expires
        assert counts.value("c", t0 + 5) is None  # expired: 10 s + 2 s grace after its end
        await driver.advance(70)  # the data ends: idle partitions close the rest
        assert sorted(closed) == [("c", t0, 10), ("c", t0 + 10_000, 10), ("c", t0 + 20_000, 10)]


async def test_late_records_are_dead_lettered_not_mixed_in() -> None:
    clock = FakeClock()
    closed: list[tuple[str, int, int]] = []
    app, clicks, counts = window_app(closed)
    t0 = base_ms(clock)
    async with TestDriver(app, clock=clock) as driver:
        await driver.send(clicks, Click("u", "c", t0 + 15_000), partition=0)
        await driver.send(clicks, Click("u", "c", t0 + 1_000), partition=0)  # late
        await driver.send(clicks, Click("u", "c", t0 + 14_000), partition=0)  # in grace
        await driver.run_until_idle()
        [dead] = await driver.dead_letters()
        assert dict(dead.headers)["flowkit.error.type"] == b"LateRecord"
        window = flowkit.Window(t0, t0 + 10_000)  # people read UTC, programs the ms
        assert (
            dict(dead.headers)["flowkit.error.message"]
            .decode()
            .startswith(f"record for window {window} ([{t0}, {t0 + 10_000}) ms) of table")
        )
        assert counts.late_records == 1
        await driver.advance(70)
    assert sorted(closed) == [("c", t0 + 10_000, 2)]


@pytest.mark.parametrize("policy", ["drop", "callable"])
async def test_late_policy_drop_or_callback(policy: str) -> None:
    clock = FakeClock()
    closed: list[Any] = []
    late: list[Any] = []
    app, clicks, counts = window_app(
        closed, late="drop" if policy == "drop" else lambda k, w, v: late.append((k, w.start))
    )
    t0 = base_ms(clock)
    async with TestDriver(app, clock=clock) as driver:
        await driver.send(clicks, Click("u", "c", t0 + 15_000), partition=0)
        await driver.send(clicks, Click("u", "c", t0 + 1_000), partition=0)
        await driver.run_until_idle()
        assert await driver.dead_letters() == []
    assert counts.late_records == 1
    assert late == ([] if policy == "drop" else [("c", t0)])


async def test_records_from_the_far_future_are_bad_input() -> None:
    clock = FakeClock()
    closed: list[Any] = []
    app, clicks, _ = window_app(closed)
    async with TestDriver(app, clock=clock) as driver:
        future = int(clock.time() * 1000) + 7200_000
        await driver.send(clicks, Click("u", "c", future), partition=0)
        await driver.send(clicks, Click("u", "c", base_ms(clock)), partition=0)
        await driver.run_until_idle()
        [dead] = await driver.dead_letters()
        assert dict(dead.headers)["flowkit.error.type"] == b"FutureRecord"
        await driver.advance(70)
    assert [v for *_, v in closed] == [1]  # the good record still counts


async def test_hopping_windows_and_the_output_topic() -> None:
    clock = FakeClock()
    app = flowkit.App("hop")
    clicks = app.topic("clicks", value_type=Click)
    out = app.topic("hop-out", value_type=flowkit.WindowResult)
    counts = app.table("counts", default=int).hopping(
        10.0, 5.0, grace=0, time=lambda c: c.t, to=out
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts.add(click.campaign, 1)

    t0 = base_ms(clock)
    async with TestDriver(app, clock=clock) as driver:
        for s in (1, 6, 11, 16):
            await driver.send(clicks, Click("u", "c", t0 + s * 1000))
        await driver.run_until_idle()
        await driver.advance(70)
        results = sorted((r.start - t0, r.value) for r in await driver.values(out))
    assert results == [(-5000, 1), (0, 2), (5000, 2), (10000, 2), (15000, 1)]


async def test_hopping_tables_refuse_item_assignment() -> None:
    clock = FakeClock()
    app = flowkit.App("hop-set")
    clicks = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).hopping(10.0, 5.0, time=lambda c: c.t)

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            assert counts[click.campaign].current() == 0  # reading is fine
            counts[click.campaign] += 1  # so is adding: every window of the record
            counts[click.campaign] = 5

    with pytest.raises(flowkit.DefinitionError, match=r"use counts\.add\(key, amount\)"):
        async with TestDriver(app, clock=clock) as driver:
            await driver.send(clicks, Click("u", "c", base_ms(clock)))
            await driver.run_until_idle()
        pytest.fail("the worker kept running")


async def test_windowed_reads_and_writes_need_an_agent_or_explicit_time() -> None:
    closed: list[Any] = []
    _, _, counts = window_app(closed)
    with pytest.raises(flowkit.NotRunningError, match="inside an agent"):
        counts["c"].current()
    with pytest.raises(flowkit.NotRunningError, match="ts="):
        counts.add("c", 1)


async def test_windowed_state_moves_with_a_restart_mid_window() -> None:
    broker, clock = MemoryBroker(), FakeClock()
    closed: list[Any] = []
    t0 = base_ms(clock)
    app, clicks, _ = window_app(closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        for i in range(5):
            await driver.send(clicks, Click("u", "c", t0 + i * 1000), partition=i % 2)
        await driver.run_until_idle()
    app, clicks, _ = window_app(closed)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        for i in range(5, 14):
            await driver.send(clicks, Click("u", "c", t0 + i * 1000), partition=i % 2)
        await driver.run_until_idle()
        await driver.advance(70)
    assert sorted(closed) == [("c", t0, 10), ("c", t0 + 10_000, 4)]


def test_graph_shows_tables_and_checks_them() -> None:
    app, _, _ = orders_app("g")
    clicks = app.topic("clicks", value_type=Click, partitions=2)
    counts = app.table("counts").tumbling(10, expires=float("inf"))
    campaigns = app.global_table("campaigns", value_type=str)

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts.add(campaigns[click.campaign], 1)

    graph = app.graph().to_dict()
    kinds = {n["id"]: n["kind"] for n in graph["nodes"]}
    assert kinds["table:totals"] == "table"
    assert kinds["table:counts"] == "windowed_table"
    assert kinds["table:campaigns"] == "global_table"
    assert kinds["topic:g-totals-changelog"] == "topic"
    assert kinds["topic:g-counts-repartition"] == "topic"
    edges = {(e["source"], e["target"], e["kind"]) for e in graph["edges"]}
    assert ("agent:add_up", "table:totals", "uses") in edges
    assert ("agent:count", "table:counts", "uses") in edges
    assert ("topic:campaigns", "table:campaigns", "feeds") in edges
    problems = app.graph().check()
    assert any("never expires" in p for p in problems)
    assert any("co-partitioned" in p and "'counts'" in p for p in problems)


async def test_windows_close_without_waiting_for_the_next_fetch() -> None:
    """Once the agents have caught up, partials and watermark markers go out at once, not
    when the next fetch returns (here: never, within the test)."""
    clock = FakeClock()
    closed: list[tuple[str, int, int]] = []
    app, clicks, _ = window_app(closed)
    t0 = base_ms(clock)
    broker = MemoryBroker()
    broker.create_topic("clicks", 2)
    producer = MemoryTransport(broker).producer()
    for i in range(15):  # 15 s of clicks on both partitions: the first window closes
        await producer.send(
            "clicks", clicks.encode(Click("u", "c", t0 + i * 1000)), partition=i % 2
        )
    worker = flowkit.Worker(app, transport=MemoryTransport(broker), clock=clock, fetch_timeout=3600)
    async with worker:
        async with asyncio.timeout(10):
            while not closed:
                await asyncio.sleep(0.01)
    assert closed == [("c", t0, 10)]


async def test_an_outbox_flush_that_fails_keeps_what_it_did_not_send() -> None:
    from flowkit.runtime.tables.keeper import StateKeeper

    app, _, counts = window_app([])
    sent: list[bytes] = []

    async def send(topic: str, value: bytes, **_: Any) -> None:
        if len(sent) == 1:
            raise ConnectionError("broker gone")
        sent.append(value)

    keeper = StateKeeper(app, MemoryTransport(), FakeClock(), send)
    store = keeper.stores[counts]
    items = [(0, None, b"a"), (1, None, b"b"), (0, None, b"c")]
    store.requeue_outbox(items)
    with pytest.raises(ConnectionError):
        await keeper.flush_outbox()
    assert sent == [b"a"]
    assert store.drain_outbox() == items[1:]
