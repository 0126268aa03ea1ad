"""Every example runs on the memory broker and produces what it says it does."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest

import flowkit
from flowkit.testing import TestDriver


async def run_for(app: flowkit.App, seconds: float) -> TestDriver:
    """Run ``app``'s worker (its own generator tasks included) for a while."""
    driver = TestDriver(app)
    async with driver:
        await asyncio.sleep(seconds)
        await driver.run_until_idle(timeout=30)
    return driver


@pytest.mark.parametrize(
    "module",
    [
        "examples.clickstream",
        "examples.ysb",
        "examples.router",
        "examples.payments",
        "examples.schema_registry",
        "examples.card_spend",
        "examples.state_on_disk",
    ],
)
def test_examples_declare_valid_graphs(module: str) -> None:
    app = importlib.import_module(module).app
    assert isinstance(app, flowkit.App)
    assert app.graph().check() == []


async def test_clickstream_counts_views(capsys: pytest.CaptureFixture[str]) -> None:
    from examples import clickstream

    app = importlib.reload(clickstream).app
    driver = await run_for(app, 1.5)
    counts = await driver.values("page-counts")
    assert counts and all(c.views % 100 == 0 for c in counts)
    assert {c.page for c in counts} <= set(clickstream.PAGES)
    printed = capsys.readouterr().out
    assert "views" in printed


async def test_ysb_example_closes_windows_from_live_traffic() -> None:
    from examples import ysb

    closed: list[Any] = []
    app = ysb.make_app(grace=0.5, idle_timeout=1.0, on_close=lambda *w: closed.append(w))
    driver = TestDriver(app, clock=flowkit.SystemClock())
    async with driver:
        # Event time follows the wall clock here: wait for a 10 s window to close.
        for _ in range(300):
            if closed:
                break
            await asyncio.sleep(0.1)
    assert closed, "no window closed within 30 s of live traffic"
    campaigns = set(ysb.campaign_map().values())
    assert all(campaign in campaigns and count > 0 for campaign, _, count in closed)


async def test_router_example_routes_and_dead_letters_demo_traffic() -> None:
    from examples import router

    app = router.make_app()
    driver = await run_for(app, 1.0)
    assert await driver.values("analytics")
    assert await driver.values("orders-big")
    dead = await driver.dead_letters()  # demo traffic drops the customer of ~2% of orders
    assert all(dict(d.headers)["flowkit.error.type"] == b"MissingFieldError" for d in dead)


async def test_payments_example_settles_every_order() -> None:
    """Every order comes out once: paid with its payment, or unpaid after its window."""
    from examples import payments

    clock = flowkit.testing.FakeClock()
    start = int(clock.time() * 1000) - 600_000
    data = payments.sample(300, start_ms=start)
    app = payments.make_app(generate=False)
    assert app.graph().check() == []
    async with TestDriver(app, clock=clock) as driver:
        for topic, key, value, ts in data:
            await driver.send(topic, value, key=key, timestamp_ms=ts)
        # One more order far ahead on every partition: stream time closes every window.
        for p in range(payments.PARTITIONS):
            await driver.send(
                "orders", payments.Order("end", "c", 1), partition=p, timestamp_ms=start + 3_600_000
            )
        await driver.run_until_idle()
        paid = {o.id: o.method for o in await driver.values("paid-orders")}
        unpaid = {o.id for o in await driver.values("unpaid-orders")}
    methods = {v.order_id: v.method for t, _, v, _ in data if t == "payments"}
    orders = {v.id for t, _, v, _ in data if t == "orders"}
    assert paid == methods
    assert unpaid == orders - set(methods)
    assert 0 < len(unpaid) < len(orders) / 4


async def test_schema_registry_example_reads_their_avro_and_writes_its_own() -> None:
    from examples import schema_registry

    totals = await schema_registry.demo()
    assert totals == [
        {"customer": "ann", "total_cents": 250},
        {"customer": "bob", "total_cents": 100},
        {"customer": "ann", "total_cents": 300},
    ]


async def test_card_spend_flags_the_burst_across_a_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from examples import card_spend

    module = importlib.reload(card_spend)  # fresh module-level state
    await module.main()
    assert capsys.readouterr().out == "card a: 110.00 between 10 s and 70 s\n"


async def test_state_on_disk_restarts_from_its_databases(tmp_path: Path) -> None:
    """A second run takes every partition of its four stores from the data directory and
    replays nothing; the tables hold what the first run counted."""
    from examples import state_on_disk as example

    clock = flowkit.testing.FakeClock()
    now = int(clock.time() * 1000)
    views = [example.View(f"u{i % 7}", example.PAGES[i % 4]) for i in range(60)]
    broker = flowkit.transports.MemoryBroker()  # the changelogs outlive the first worker
    for run in range(2):
        app = example.make_app(data_dir=str(tmp_path), generate=False)
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            if run == 0:
                for view in views:
                    await driver.send("views", view, key=view.user, timestamp_ms=now)
                await driver.send("purchases", example.Purchase("u1", 500), key="u1")
            await driver.run_until_idle()
            recovery = driver.worker.state.recovery
            per_user = dict(app.tables["views_per_user"].items())
            windows = app.tables["views_per_page"]
            per_page = {page: windows[page].value(now) for page in example.PAGES}
            sliding = app.tables["views_last_minute"]
            last_minute = {f"u{i}": sliding[f"u{i}"].value(now) for i in range(7)}
    assert recovery.from_local == 4 * example.PARTITIONS and recovery.done == 0
    assert per_user == {f"u{i}": sum(1 for v in views if v.user == f"u{i}") for i in range(7)}
    assert last_minute == per_user
    assert per_page == {page: 15 for page in example.PAGES}
