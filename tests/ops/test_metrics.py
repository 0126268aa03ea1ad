"""The worker's metrics: lag, latency, tables, windows, sinks, rebalances, the app's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import generate_latest

import flowkit
from flowkit.errors import DefinitionError, NotRunningError
from flowkit.testing import TestDriver


class Click(flowkit.Record):
    user: str


def _app() -> tuple[flowkit.App, flowkit.Topic[Click], flowkit.App]:
    app = flowkit.App("metrics-demo", partitions=2)
    clicks = app.topic("clicks", value_type=Click, key_type=str)
    counts = app.table("counts", default=int)
    seen = app.metrics.counter("clicks_seen", "Clicks the agent saw", ["user"])
    out = app.topic("out", value_type=str)

    @app.agent(clicks, sink=[out])
    async def count(stream: flowkit.Stream[Click]) -> AsyncIterator[str]:
        async for click in stream:
            counts[click.user] += 1
            seen.labels(click.user).inc()
            yield click.user

    return app, clicks, app


def sample(driver: TestDriver, name: str, **labels: str) -> float | None:
    value = driver.worker.metrics.registry.get_sample_value(name, labels)
    return value


async def test_metrics_after_a_run() -> None:
    app, clicks, _ = _app()
    async with TestDriver(app) as driver:
        for user in ("a", "b", "a"):
            await driver.send(clicks, Click(user), key=user)
        await driver.run_until_idle()
        await driver.worker.checkpoint()
        assert sample(driver, "clicks_seen_total", user="a") == 2
        lag = [
            sample(driver, "flowkit_consumer_lag_records", topic="clicks", partition=str(p))
            for p in (0, 1)
        ]
        assert lag == [0, 0]
        assert sample(driver, "flowkit_consumer_lag_seconds", topic="clicks", partition="0") == 0
        keys = [
            sample(driver, "flowkit_table_keys", table="counts", partition=str(p)) for p in (0, 1)
        ]
        assert sum(k or 0 for k in keys) == 2
        assert sample(driver, "flowkit_changelog_records_total", table="counts") == 2
        assert sample(driver, "flowkit_e2e_latency_seconds_count", agent="count") >= 1
        assert sample(driver, "flowkit_batch_seconds_count", agent="count") >= 1
        assert sample(driver, "flowkit_rebalances_total", kind="assign") == 1
        assert sample(driver, "flowkit_recovery_records_left") == 0
        text = generate_latest(driver.worker.metrics.registry).decode()
        assert "flowkit_rebalance_seconds_bucket" in text


async def test_two_workers_of_one_app_count_apart() -> None:
    app, clicks, _ = _app()
    async with TestDriver(app) as one, TestDriver(app) as two:
        await one.send(clicks, Click("a"), key="a")
        await one.run_until_idle()
        await two.run_until_idle()
        assert sample(one, "clicks_seen_total", user="a") == 1
        assert sample(two, "clicks_seen_total", user="a") is None


async def test_lag_counts_every_record_not_processed_yet() -> None:
    app = flowkit.App("lag-demo")
    clicks = app.topic("clicks", value_type=Click)
    go = asyncio.Event()

    @app.agent(clicks)
    async def blocked(stream: flowkit.Stream[Click]) -> None:
        async for _ in stream:
            await go.wait()

    async with TestDriver(app, max_fetch_records=1, queue_batches=1) as driver:
        for _ in range(5):
            await driver.send(clicks, Click("a"))
        # One batch in the agent (its record not done), one queued, one waiting to be
        # queued, two not read: all five are lag, fetched or not.
        lag = None
        for _ in range(200):
            lag = sample(driver, "flowkit_consumer_lag_records", topic="clicks", partition="0")
            if lag == 5:
                break
            await asyncio.sleep(0.01)
        assert lag == 5
        assert sample(driver, "flowkit_consumer_lag_seconds", topic="clicks", partition="0") > 0
        go.set()
        await driver.run_until_idle()
        assert sample(driver, "flowkit_consumer_lag_records", topic="clicks", partition="0") == 0


def test_app_metrics_are_declarations() -> None:
    app = flowkit.App("decl")
    hits = app.metrics.gauge("hits", "Hits")
    with pytest.raises(DefinitionError, match="declared twice"):
        app.metrics.counter("hits", "again")
    with pytest.raises(DefinitionError, match="flowkit_ prefix"):
        app.metrics.counter("flowkit_mine", "no")
    with pytest.raises(DefinitionError, match="not a Prometheus metric name"):
        app.metrics.counter("bad name", "no")
    with pytest.raises(NotRunningError, match="metric 'hits'"):
        hits.set(1)


async def test_future_records_and_sink_writes_are_counted() -> None:
    app = flowkit.App("sinkdemo")
    clicks = app.topic("clicks", value_type=Click, key_type=str)
    per_window = app.table("per_window", default=int).tumbling(10.0)
    written: list[str] = []

    def keep(user: str) -> None:
        written.append(user)

    @app.agent(clicks, sink=[keep])
    async def count(stream: flowkit.Stream[Click]) -> AsyncIterator[str]:
        async for click in stream:
            per_window[click.user] += 1
            yield click.user

    async with TestDriver(app) as driver:
        now_ms = int(driver.clock.time() * 1000)
        await driver.send(clicks, Click("a"), key="a", timestamp_ms=now_ms)
        await driver.send(clicks, Click("b"), key="b", timestamp_ms=now_ms + 10 * 3600_000)
        await driver.run_until_idle()
        await driver.worker.checkpoint()
        rejected = "flowkit_window_rejected_records_total"
        assert sample(driver, rejected, agent="count", reason="future") == 1
        assert sample(driver, "flowkit_dead_letters_total", stage="window") == 1
        assert written == ["a"]
        assert driver.worker.dispatcher is not None
        (runner,) = driver.worker.dispatcher.runners.values()
        assert runner.name.endswith("keep")  # the function's qualified name
        assert sample(driver, "flowkit_sink_written_total", sink=runner.name) == 1
        assert sample(driver, "flowkit_sink_pending", sink=runner.name) == 0
        assert sample(driver, "flowkit_sink_batches_total", sink=runner.name) == 1
        assert sample(driver, "flowkit_sink_retries_total", sink=runner.name) == 0
        watermark = "flowkit_window_watermark_seconds"
        assert sample(driver, watermark, table="per_window", partition="0") is not None
