"""Declared aggregations and running updates: their declarations' one-line refusals, the
graph, ``to=`` with the ``final`` flag, several partitions, a restart, and the estimate of
``DistinctCount``. The reference comparison is test_window_reference.py."""

from __future__ import annotations

import operator
import random
import re
from typing import Any

import msgspec
import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker


class Sale(flowkit.Record):
    shop: str
    t: int  # ms
    cents: int


def declare(partitions: int = 1, **options: Any) -> flowkit.WindowedTable[Any, Any]:
    app = flowkit.App("aggs", partitions=partitions)
    return app.table("t").tumbling(10.0, **options)


def test_declarations_refuse_with_one_line() -> None:
    no_merge = flowkit.Aggregation(initial=list, add=lambda acc, v: [*acc, v])
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"aggregate": "count"}, 1, "aggregate must be an aggregation such as flowkit.Count()"),
        (
            {"aggregate": flowkit.Count(), "combine": max},
            1,
            "give aggregate= or combine=, not both",
        ),
        ({"aggregate": no_merge}, 4, "has no merge, and its 4 partitions' partials are merged"),
        ({"emit_on": "change"}, 1, "emit_on must be 'close' or 'update', not str 'change'"),
        ({"on_update": print}, 1, "on_update is called with emit_on='update' only"),
        (
            {"emit_on": "update", "on_update": lambda k, w, v: None},
            1,
            "with emit_on='update', on_update is called with (key, window, value, final)",
        ),
    ]
    for options, partitions, message in cases:
        with pytest.raises(flowkit.DefinitionError, match=re.escape(message)) as info:
            declare(partitions, **options)
        assert "\n" not in str(info.value)
    with pytest.raises(flowkit.DefinitionError, match="field must be a field name"):
        flowkit.Sum("a b")
    with pytest.raises(flowkit.DefinitionError, match="precision must be an int from 4 to 16"):
        flowkit.DistinctCount(precision=2)
    # One partition merges nothing: a triple without merge is enough there.
    assert declare(1, aggregate=no_merge).aggregation is no_merge


def test_a_window_kind_can_require_merge() -> None:
    # The hook session windows use: a kind that merges accumulators itself.
    class Merging(flowkit.WindowSpec):
        @property
        def requires_merge(self) -> bool:
            return True

    spec = flowkit.TumblingWindow(10.0)
    merging = Merging(
        spec.size_ms, spec.step_ms, spec.grace_ms, spec.expires_ms, spec.max_future_ms
    )
    no_merge = flowkit.Aggregation(initial=int, add=operator.add)
    with pytest.raises(flowkit.DefinitionError, match="tumbling windows merge accumulators"):
        flowkit.WindowedTable("s", spec=merging, app_name="a", partitions=1, aggregate=no_merge)


def test_graph_shows_the_emit_mode_and_the_aggregation() -> None:
    described = declare(aggregate=flowkit.Sum("cents"), emit_on="update").describe()
    assert (described["aggregate"], described["emit_on"]) == ("sum(cents)", "update")
    plain = declare().describe()
    assert plain["emit_on"] == "close" and "aggregate" not in plain


def test_slots_are_not_written_by_hand_on_an_aggregated_table() -> None:
    table = declare(aggregate=flowkit.Mean("cents"))
    with pytest.raises(flowkit.DefinitionError, match=r"t\[key\] \+= n would add n itself"):
        table["k"] += 1
    with pytest.raises(flowkit.DefinitionError, match="would replace its accumulator"):
        table["k"] = 1


def sales_app(
    name: str, partitions: int, **options: Any
) -> tuple[flowkit.App, flowkit.Topic[Sale], dict[str, Any], flowkit.Topic[Any]]:
    app = flowkit.App(name, partitions=partitions)
    sales = app.topic("sales", value_type=Sale)
    out = app.topic("results", value_type=flowkit.WindowResult)
    tables = {
        "mean": app.table("mean").tumbling(
            10.0, aggregate=flowkit.Mean("cents"), to=out, **options
        ),
        "collect": app.table("collect").tumbling(
            10.0, aggregate=flowkit.Collect("cents", limit=4), **options
        ),
        "spread": app.table("spread").tumbling(
            10.0,
            aggregate=flowkit.Aggregation(
                initial=lambda: None,
                add=lambda acc, s: (
                    [s.cents, s.cents]
                    if acc is None
                    else [min(acc[0], s.cents), max(acc[1], s.cents)]
                ),
                merge=lambda a, b: [min(a[0], b[0]), max(a[1], b[1])],
                result=lambda acc: acc[1] - acc[0],
            ),
            **options,
        ),
    }

    @app.agent(sales)
    async def add(stream: flowkit.Stream[Sale]) -> None:
        async for sale in stream:
            for table in tables.values():
                table.add("all", sale)

    return app, sales, tables, out


@pytest.mark.usefixtures("window_store")  # on each store (tests/conftest.py)
async def test_partitions_combine_and_a_restart_goes_on_exactly() -> None:
    options = {"grace": 0.0, "time": lambda s: s.t, "idle_timeout": None}
    app, sales, tables, out = sales_app("aggrestart", 2, **options)
    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    start = now - now % 10_000
    broker = MemoryBroker()
    cents = [5, 1, 9, 3, 7, 2]
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        for i, c in enumerate(cents[:3]):  # shops on both partitions
            await driver.send(sales, Sale(f"s{i}", start + i, c), key=f"s{i}")
        await driver.run_until_idle()
        assert tables["mean"].windows("all") == {flowkit.Window(start, start + 10_000): 5.0}
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        for i, c in enumerate(cents[3:], 3):
            await driver.send(sales, Sale(f"s{i}", start + i, c), key=f"s{i}")
        for p in (0, 1):  # the window closes on both partitions
            await driver.send(sales, Sale("x", start + 10_000, 0), key="x", partition=p)
        await driver.run_until_idle()
        results = await driver.values(out)
        window = flowkit.Window(start, start + 10_000)
        assert tables["spread"].windows("all")[window] == 9 - 1
        collected = tables["collect"].windows("all")[window]
        assert len(collected) == 4 and set(collected) <= set(cents)
    assert [(r.key, r.start, r.value, r.final) for r in results] == [
        ("all", start, sum(cents) / len(cents), True)
    ]


@pytest.mark.usefixtures("window_store")  # on each store (tests/conftest.py)
async def test_running_updates_reach_to_with_the_final_flag() -> None:
    app, sales, _, out = sales_app(
        "aggupdates", 1, grace=0.0, time=lambda s: s.t, idle_timeout=None, emit_on="update"
    )
    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    start = now - now % 10_000
    async with TestDriver(app, clock=clock) as driver:
        for t, c in ((1, 4), (2, 8), (10_001, 1)):
            await driver.send(sales, Sale("s", start + t, c), key="s")
            await driver.run_until_idle()
        raw = [m.value for m in await driver.messages(out)]
    decoded = [msgspec.json.decode(v) for v in raw]
    assert [(d["start"] - start, d["value"], d.get("final", True)) for d in decoded] == [
        (0, 4.0, False),
        (0, 6.0, False),
        (10_000, 1.0, False),
        (0, 6.0, True),
    ]
    assert all("final" not in d for d in decoded if d["value"] == 6.0 and d is decoded[-1])


def test_distinct_count_is_within_its_standard_error() -> None:
    agg = flowkit.DistinctCount()
    rng = random.Random(3)
    values = [rng.getrandbits(40) for _ in range(20_000)]
    halves = [agg.initial(), agg.initial()]
    for i, v in enumerate(values + values[:5000]):  # repeats do not count
        halves[i % 2] = agg.add(halves[i % 2], v)
    estimate = agg.finish(agg.merge(*halves))
    assert abs(estimate - 20_000) <= 3 * 0.065 * 20_000
    small = agg.initial()
    for v in range(12):
        small = agg.add(small, f"user-{v}")
    assert agg.finish(small) == 12


async def test_a_record_without_the_field_is_a_dead_letter() -> None:
    app = flowkit.App("aggfield", partitions=1)
    sales = app.topic("sales", value_type=Sale)
    totals = app.table("totals").tumbling(10.0, aggregate=flowkit.Sum("price"))
    counts = app.table("counts").tumbling(10.0, aggregate=flowkit.Count())

    @app.agent(sales)
    async def add(stream: flowkit.Stream[Sale]) -> None:
        async for sale in stream:
            counts.add(sale.shop, sale)
            totals.add(sale.shop, sale)  # Sale has no field "price"

    async with TestDriver(app) as driver:
        for _ in range(2):
            await driver.send(sales, Sale("s", 1, 5), key="s")
        await driver.run_until_idle()
        letters = await driver.dead_letters()
        assert sum(counts.windows("s").values()) == 2  # the agent went on
    assert len(letters) == 2
    headers = dict(letters[0].headers)
    assert headers["flowkit.error.type"] == b"AttributeError"
    assert b"price" in headers["flowkit.error.message"]


@pytest.mark.parametrize("tumbling", [True, False], ids=["tumbling", "hopping"])
async def test_a_late_callable_gets_the_record_not_the_extracted_value(tumbling: bool) -> None:
    # As on a plain table, late= gets what the agent passed to add(), whatever the
    # aggregation takes from it: for Sum("cents") the sale, not its cents.
    app = flowkit.App("agglate", partitions=1)
    sales = app.topic("sales", value_type=Sale)
    late: dict[str, list[Any]] = {}
    window = (10.0,) if tumbling else (10.0, 5.0)
    tables: dict[str, Any] = {}
    for name, aggregate in (
        ("count", flowkit.Count()),
        ("sum", flowkit.Sum("cents")),
        ("min", flowkit.Min("cents")),
        ("max", flowkit.Max("cents")),
        ("mean", flowkit.Mean("cents")),
    ):
        declare_window = app.table(name).tumbling if tumbling else app.table(name).hopping
        tables[name] = declare_window(
            *window,
            grace=0.0,
            time=lambda s: s.t,
            idle_timeout=None,
            aggregate=aggregate,
            late=lambda key, w, record, name=name: late.setdefault(name, []).append(record),
        )

    @app.agent(sales)
    async def add(stream: flowkit.Stream[Sale]) -> None:
        async for sale in stream:
            for table in tables.values():
                table.add(sale.shop, sale)

    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    async with TestDriver(app, clock=clock) as driver:
        for t, cents in ((0, 4), (30_000, 5), (1, 6)):  # the last is late
            await driver.send(sales, Sale("s", now + t, cents), key="s")
        await driver.run_until_idle()
    late_sale = Sale("s", now + 1, 6)
    hits = 1 if tumbling else 2  # a hopping record is late in each of its windows
    assert late == {name: [late_sale] * hits for name in tables}
