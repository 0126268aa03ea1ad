"""What windowed tables hand out: to= with emit=, late= topics and async callables,
on_close errors by the table's on_error, and type checks at the edges."""

from __future__ import annotations

from typing import Any

import pytest

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.windows import Window

# The same suite on each store of windowed tables (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("window_store")


class Click(flowkit.Record):
    page: str
    t: int  # ms


class PageCount(flowkit.Record):
    page: str
    window_start: int
    views: int


def page_count(page: str, window: Window, views: int) -> PageCount:
    return PageCount(page, window.start, views)


def make_app(
    name: str = "wout", emit: Any = None, **options: Any
) -> tuple[flowkit.App, flowkit.Topic[Click], Any, flowkit.Topic[PageCount]]:
    app = flowkit.App(name, partitions=1)
    clicks = app.topic("clicks", value_type=Click)
    out = app.topic("page-counts", value_type=PageCount)
    if emit is not None:
        options.update(to=out, emit=emit)
    if options.get("late") == "topic":
        options["late"] = app.topic("late-clicks", value_type=Click)
    counts = app.table("counts", default=int).tumbling(
        10.0, grace=0.0, time=lambda c: c.t, idle_timeout=None, **options
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts.add(click.page, 1)

    return app, clicks, counts, out


async def feed(driver: TestDriver, clicks: flowkit.Topic[Click], times: list[int]) -> None:
    for t in times:
        await driver.send(clicks, Click("/", t), key="/", timestamp_ms=t)
        await driver.run_until_idle()
    await driver.run_until_idle()


def t0(clock: FakeClock) -> int:
    now = int(clock.time() * 1000) - 600_000
    return now - now % 10_000


async def test_to_with_emit_sends_the_topics_record_type() -> None:
    app, clicks, _, out = make_app(emit=page_count)
    assert app.graph().check() == []
    clock = FakeClock()
    start = t0(clock)
    async with TestDriver(app, clock=clock) as driver:
        await feed(driver, clicks, [start + 1, start + 2, start + 10_001])
        assert await driver.values(out) == [PageCount("/", start, 2)]


def test_graph_check_knows_what_to_and_emit_send() -> None:
    app = flowkit.App("wout", partitions=1)
    out = app.topic("page-counts", value_type=PageCount)

    def unannotated(k: Any, w: Any, v: Any):  # type: ignore[no-untyped-def]
        return PageCount(k, w.start, v)

    def wrong(k: str, w: Window, v: int) -> Click:
        return Click(k, w.start)

    app.table("plain", default=int).tumbling(10.0, to=out)
    app.table("wrong", default=int).tumbling(10.0, to=out, emit=wrong)
    app.table("right", default=int).tumbling(10.0, to=out, emit=page_count)
    app.table("loose", default=int).tumbling(10.0, to=out, emit=unannotated)
    problems = app.graph().check()
    assert problems == [
        "windowed table 'plain' sends WindowResult to topic 'page-counts' whose readers "
        "expect PageCount: give emit= a function (key, window, value) -> PageCount",
        "windowed table 'wrong' sends Click to topic 'page-counts' whose readers expect "
        "PageCount: change emit= or the topic's value_type",
    ]


async def test_emit_of_the_wrong_type_is_a_dead_letter_at_run_time() -> None:
    app, clicks, _, out = make_app(emit=lambda k, w, v: Click(k, v))  # unannotated
    clock = FakeClock()
    start = t0(clock)
    async with TestDriver(app, clock=clock) as driver:
        await feed(driver, clicks, [start + 1, start + 10_001])
        assert await driver.values(out) == []
        dead = await driver.dead_letters()
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert headers["flowkit.error.stage"] == b"window_close"
    assert headers["flowkit.error.message"] == (
        b"table 'counts': emit returned Click, but topic 'page-counts' takes PageCount"
    )


@pytest.mark.parametrize("late", ["topic", "callable"])
async def test_late_to_a_topic_and_to_an_async_callable(late: str) -> None:
    got: list[tuple[str, int, int]] = []

    async def late_cb(key: str, window: Window, amount: int) -> None:
        got.append((key, window.start, amount))

    app, clicks, counts, _ = make_app(late=late if late == "topic" else late_cb)
    clock = FakeClock()
    start = t0(clock)
    async with TestDriver(app, clock=clock) as driver:
        await feed(driver, clicks, [start + 1, start + 10_001, start + 5])
        assert driver.store(counts).late_records == 1
        if late == "topic":
            assert await driver.values("late-clicks") == [Click("/", start + 5)]
        else:
            assert got == [("/", start, 1)]  # awaited, not a coroutine left unawaited
        assert await driver.dead_letters() == []


@pytest.mark.parametrize("on_error", ["dead_letter", "log"])
async def test_on_close_errors_follow_on_error(on_error: str) -> None:
    def boom(key: str, window: Window, value: int) -> None:
        raise RuntimeError("downstream is down")

    app, clicks, counts, _ = make_app(on_close=boom, on_error=on_error)
    clock = FakeClock()
    start = t0(clock)
    async with TestDriver(app, clock=clock) as driver:
        await feed(driver, clicks, [start + 1, start + 10_001])
        assert driver.store(counts).callback_errors == 1
        dead = await driver.dead_letters()
    if on_error == "log":
        assert dead == []
        return
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert headers["flowkit.error.type"] == b"RuntimeError"
    assert headers["flowkit.table"] == b"counts"
    assert dead[0].value == b'{"key":"/","start":%d,"end":%d,"value":1}' % (start, start + 10_000)


def test_bad_on_error_and_emit_without_to_are_definition_errors() -> None:
    with pytest.raises(flowkit.DefinitionError, match="on_error must be"):
        make_app(on_error="retry")
    with pytest.raises(flowkit.DefinitionError, match="give to="):
        flowkit.App("x").table("t").tumbling(10.0, emit=page_count)


def test_topic_send_checks_the_value_type() -> None:
    app = flowkit.App("types", partitions=1)
    clicks = app.topic("clicks", value_type=Click)
    for wrong, name in (
        (PageCount("/", 0, 1), "PageCount"),
        ({"page": "/"}, "dict"),
        (b"x", "bytes"),
    ):
        with pytest.raises(TypeError, match=f"topic 'clicks' takes Click, not {name}"):
            clicks.check_value(wrong)
    clicks.check_value(Click("/", 1))
    clicks.check_value(None)  # a tombstone

    class WideClick(flowkit.Record):
        page: str
        t: int
        user: str

    clicks.check_value(WideClick("/", 1, "u"))  # every field the readers decode is there


async def test_send_outside_a_worker_checks_the_type_first() -> None:
    app = flowkit.App("types", partitions=1)
    clicks = app.topic("clicks", value_type=Click)
    with pytest.raises(TypeError, match="takes Click, not str"):
        await clicks.send("/")  # type: ignore[arg-type]


async def test_an_agent_yielding_the_wrong_type_is_dead_lettered() -> None:
    app = flowkit.App("yields", partitions=1)
    clicks = app.topic("clicks", value_type=Click)
    out = app.topic("counts", value_type=PageCount)

    @app.agent(clicks, sink=[out])
    async def relay(stream):  # type: ignore[no-untyped-def]
        async for click in stream:
            yield click if click.t == 0 else PageCount(click.page, click.t, 1)

    async with TestDriver(app) as driver:
        await driver.send(clicks, Click("/", 0))
        await driver.send(clicks, Click("/", 5))
        await driver.run_until_idle()
        assert await driver.values(out) == [PageCount("/", 5, 1)]
        dead = await driver.dead_letters()
    assert len(dead) == 1
    assert dict(dead[0].headers)["flowkit.error.message"] == (
        b"agent 'relay' yielded Click, but topic 'counts' takes PageCount"
    )
