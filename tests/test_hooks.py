"""@app.on_startup and @app.on_shutdown: in order, in the worker's scope, before the commit."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker


def hooks_app(calls: list[str], *, fail: str = "") -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("hooks")
    numbers = app.topic("numbers", value_type=int)
    events = app.topic("lifecycle", value_type=str)
    totals = app.table("totals", default=int)

    @app.on_startup
    async def announce() -> None:
        calls.append("startup 1")
        await events.send("started")

    @app.on_startup
    async def second() -> None:
        calls.append("startup 2")
        if fail == "startup":
            raise RuntimeError("no database")

    @app.agent(numbers)
    async def add_up(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            totals["sum"] += n
            calls.append(f"record {n}")

    @app.on_shutdown
    async def farewell() -> None:
        calls.append("shutdown 1")
        if fail == "shutdown":
            raise RuntimeError("boom")

    @app.on_shutdown
    async def report() -> None:
        calls.append(f"shutdown 2 sum={totals['sum']}")
        await events.send(f"stopped at {totals['sum']}")

    return app, numbers, events


async def test_hooks_run_in_order_around_the_records_and_can_send() -> None:
    calls: list[str] = []
    broker = MemoryBroker()
    app, numbers, events = hooks_app(calls)
    async with TestDriver(app, broker=broker, clock=FakeClock()) as driver:
        await driver.send(numbers, 2)
        await driver.send(numbers, 3)
        await driver.run_until_idle()
    assert calls == [
        "startup 1",
        "startup 2",
        "record 2",
        "record 3",
        "shutdown 1",
        "shutdown 2 sum=5",
    ]
    # What the shutdown hook sent was acknowledged before the final commit.
    app, numbers, events = hooks_app([])
    async with TestDriver(app, broker=broker, clock=FakeClock()) as driver:
        assert await driver.values(events) == ["started", "stopped at 5", "started"]
        assert driver.worker.records_in == 0  # the first run committed everything


async def test_a_failing_startup_hook_stops_the_start_without_shutdown_hooks() -> None:
    calls: list[str] = []
    app, _, _ = hooks_app(calls, fail="startup")
    with pytest.raises(flowkit.TaskFailed, match=r"startup hook 'second' failed: RuntimeError"):
        async with TestDriver(app, clock=FakeClock()):
            pytest.fail("the worker started")
    assert calls == ["startup 1", "startup 2"]


async def test_a_failing_shutdown_hook_is_logged_and_the_next_one_runs() -> None:
    calls: list[str] = []
    app, _, _ = hooks_app(calls, fail="shutdown")
    with structlog.testing.capture_logs() as logs:
        async with TestDriver(app, clock=FakeClock()):
            pass
    assert calls == ["startup 1", "startup 2", "shutdown 1", "shutdown 2 sum=0"]
    [failed] = [e for e in logs if e["event"] == "shutdown hook failed"]
    assert failed["hook"] == "farewell"


def test_hooks_must_be_async() -> None:
    app = flowkit.App("sync-hook")
    with pytest.raises(flowkit.DefinitionError, match=r"@app.on_startup 'setup' must be async"):

        @app.on_startup
        def setup() -> None:
            pass
