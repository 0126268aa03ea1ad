"""stream.group_by inside an agent: re-keyed through a repartition topic, on both brokers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import flowkit
from flowkit.streams.hops import Hop, found_hops, split
from tests.conftest import DriverFactory


class Click(flowkit.Record):
    user: str
    campaign: str
    n: int


def make_app() -> tuple[flowkit.App, flowkit.Topic[Click], flowkit.Topic[str], flowkit.Table]:
    app = flowkit.App("regroup", partitions=4)
    clicks = app.topic("clicks", value_type=Click)
    out = app.topic("per-campaign", value_type=str)
    totals = app.table("totals", default=int)

    @app.agent(clicks, sink=[out])
    async def per_campaign(stream: flowkit.Stream[Click]) -> AsyncIterator[str]:
        grouped = stream.filter(lambda c: c.n > 0).group_by(
            lambda c: c.campaign, name="by-campaign"
        )
        async for click in grouped.events():
            totals[click.value.campaign] += click.value.n  # written on its own partition
            assert click.key == click.value.campaign
            yield f"{click.value.campaign}:{click.value.user}"

    return app, clicks, out, totals


async def test_group_by_rekeys_through_the_repartition_topic(make_driver: DriverFactory) -> None:
    app, clicks, out, totals = make_app()
    sent = [Click(f"u{i}", f"c{i % 5}", i % 3) for i in range(60)]  # keyed by user
    async with make_driver(app) as driver:
        for click in sent:
            await driver.send(clicks, click, key=click.user)
        await driver.run_until_idle()
        got = await driver.values(out)
        assert sorted(got) == sorted(f"{c.campaign}:{c.user}" for c in sent if c.n > 0)
        rep = await driver.messages("regroup-by-campaign-repartition")
        partition_of = {m.key: m.partition for m in rep}
        assert len(partition_of) == 5 and len(rep) == 40
        store = driver.store(totals)
        want: dict[str, int] = {}
        for c in sent:
            want[c.campaign] = want.get(c.campaign, 0) + c.n
        assert {k: store[k] for k in store} == want


def test_graph_shows_the_hop() -> None:
    app, *_ = make_app()
    graph = app.graph()
    edges = {(e.source, e.target, e.kind) for e in graph.edges}
    rep = "topic:regroup-by-campaign-repartition"
    assert ("agent:per_campaign", rep, "forwards") in edges
    assert (rep, "agent:per_campaign", "reads") in edges
    node = graph.node(rep)
    assert node is not None and node.attrs["internal"] is True
    assert graph.check() == []


def test_found_hops_finds_literal_group_names_only() -> None:
    async def agent(stream: flowkit.Stream[Click]) -> None:
        name = "dynamic"
        async for _ in stream.group_by(lambda c: c.user, name="by-user", partitions=8):
            pass
        async for _ in stream.group_by(lambda c: c.user, name=name):
            pass

    assert found_hops(agent).groups == {"by-user": 8}


def test_only_filter_may_come_before_group_by() -> None:
    with pytest.raises(flowkit.DefinitionError, match="only filter"):
        split((("map", len), ("hop", Hop("group_by", "users", len))))
    _, before, after = split((("filter", bool), ("hop", Hop("group_by", "u", len)), ("map", str)))
    assert [k for k, _ in before] == ["filter"] and [k for k, _ in after] == ["map"]


def test_a_decorators_topic_group_by_is_not_the_stream_form() -> None:
    app = flowkit.App("deco", partitions=2)
    clicks = app.topic("clicks", value_type=Click)

    @app.agent(clicks.group_by(lambda c: c.campaign, name="by-campaign"))
    async def total(stream: flowkit.Stream[Click]) -> None:
        async for _ in stream:
            pass

    assert total.hops == {}
    assert "deco-by-campaign-repartition" in app.topics
