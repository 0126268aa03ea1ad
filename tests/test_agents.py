"""Agents end to end through flowkit.testing, on the memory broker and on Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog.testing

import flowkit
from flowkit.testing import FakeClock, TestDriver
from tests.conftest import ALL_CLIENTS, EVERY_BROKER, DriverFactory


class View(flowkit.Record):
    user: str
    page: str
    kind: str


def make_app(name: str = "t") -> tuple[flowkit.App, flowkit.Topic[View], flowkit.Topic[str]]:
    app = flowkit.App(name)
    views = app.topic("views", value_type=View, partitions=4)
    out = app.topic("out", value_type=str, partitions=4)
    return app, views, out


async def test_stream_agent_filters_maps_and_yields(make_driver: DriverFactory) -> None:
    app, views, out = make_app()

    @app.agent(views, sink=[out])
    async def pages(stream: flowkit.Stream[View]) -> AsyncIterator[str]:
        async for page in stream.filter(lambda v: v.kind == "view").map(lambda v: v.page):
            yield page.upper()

    async with make_driver(app) as driver:
        for i in range(10):
            await driver.send(views, View(f"u{i}", f"p{i}", "view" if i % 2 else "click"))
        await driver.run_until_idle()
        assert sorted(await driver.values(out)) == ["P1", "P3", "P5", "P7", "P9"]


async def test_outputs_keep_the_input_key_and_partition(make_driver: DriverFactory) -> None:
    app, views, out = make_app()

    @app.agent(views, sink=[out], per_record=True)
    def page(view: View) -> str:
        return view.page

    async with make_driver(app) as driver:
        for i in range(20):
            await driver.send(views, View(f"u{i}", f"p{i}", "view"), key=f"u{i}")
        await driver.run_until_idle()
        inputs = {m.key: m.partition for m in await driver.messages(views)}
        outputs = await driver.messages(out)
        assert len(outputs) == 20
        for m in outputs:
            assert inputs[m.key] == m.partition


async def test_per_record_async_handler_and_none_means_no_output(
    make_driver: DriverFactory,
) -> None:
    app, views, out = make_app()

    @app.agent(views, sink=[out], per_record=True)
    async def only_views(view: View) -> str | None:
        await asyncio.sleep(0)
        return view.user if view.kind == "view" else None

    async with make_driver(app) as driver:
        await driver.send(views, View("a", "/", "view"))
        await driver.send(views, View("b", "/", "click"))
        await driver.run_until_idle()
        assert await driver.values(out) == ["a"]


async def test_output_sets_key_headers_and_routes(make_driver: DriverFactory) -> None:
    app, views, out = make_app()
    audit = app.topic("audit", value_type=str)
    seen: list[str] = []

    @app.agent(views, sink=[out, seen.append])
    async def route(stream: flowkit.Stream[View]) -> AsyncIterator[Any]:
        async for v in stream:
            if v.kind == "audit":
                yield flowkit.Output(v.user, key="k", headers=(("h", b"1"),), to=[audit])
            else:
                yield v.user

    async with make_driver(app) as driver:
        await driver.send(views, View("a", "/", "view"))
        await driver.send(views, View("b", "/", "audit"))
        await driver.run_until_idle()
        assert await driver.values(out) == ["a"]
        assert seen == ["a"]
        [m] = await driver.messages(audit)
        assert (m.key, m.headers, m.value) == (b"k", (("h", b"1"),), b"b")


async def test_events_give_the_envelope(make_driver: DriverFactory) -> None:
    app, views, _ = make_app()
    got: list[flowkit.Event[View]] = []

    @app.agent(views)
    async def envelopes(stream: flowkit.Stream[View]) -> None:
        async for event in stream.events():
            got.append(event)

    async with make_driver(app) as driver:
        await driver.send(
            views, View("a", "/", "view"), key="a", headers=(("x", b"y"),), timestamp_ms=1234
        )
        await driver.run_until_idle()
    [event] = got
    assert event.key == "a" and event.value.user == "a" and event.timestamp == 1234
    assert event.header("x") == b"y" and event.topic == "views" and event.offset == 0


async def test_batches_group_values_and_commit_after_the_list(make_driver: DriverFactory) -> None:
    app = flowkit.App("b")
    nums = app.topic("nums", value_type=int)
    lists: list[list[int]] = []

    @app.agent(nums)
    async def collect(stream: flowkit.Stream[int]) -> None:
        async for chunk in stream.batches(max_size=4, within_seconds=0.05):
            lists.append(chunk)

    async with make_driver(app) as driver:
        for i in range(10):
            await driver.send(nums, i)
        await driver.run_until_idle()
        await asyncio.sleep(0.1)  # let the last, partial list time out
        await driver.run_until_idle()
    assert [x for chunk in lists for x in chunk] == list(range(10))
    assert all(len(chunk) <= 4 for chunk in lists) and lists[0] == [0, 1, 2, 3]


async def test_topic_send_from_an_agent_and_agent_as_sink(make_driver: DriverFactory) -> None:
    app = flowkit.App("s")
    a = app.topic("a", value_type=int)
    b = app.topic("b", value_type=int)
    c = app.topic("c", value_type=int)
    total: list[int] = []

    @app.agent(b)
    async def last(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            total.append(n)

    @app.agent(a, sink=[last])
    async def first(stream: flowkit.Stream[int]) -> AsyncIterator[int]:
        async for n in stream:
            await c.send(n * 10)
            yield n + 1

    async with make_driver(app) as driver:
        await driver.send(a, 1)
        await driver.run_until_idle()
        assert total == [2]
        assert await driver.values(c) == [10]


async def test_concurrency_keeps_partition_order(make_driver: DriverFactory) -> None:
    app = flowkit.App("c")
    nums = app.topic("nums", value_type=int, partitions=4)
    seen: dict[str, list[int]] = {}

    @app.agent(nums, concurrency=3)
    async def record(stream: flowkit.Stream[int]) -> None:
        async for event in stream.events():
            seen.setdefault(event.key, []).append(event.value)
            await asyncio.sleep(0)

    async with make_driver(app) as driver:
        for i in range(200):
            await driver.send(nums, i, key=f"k{i % 7}")
        await driver.run_until_idle()
    assert sum(len(v) for v in seen.values()) == 200
    for values in seen.values():
        assert values == sorted(values)


# On every broker, Apache Kafka too: the dead letter's envelope as each broker keeps it, and
# the apache params of make_driver kept working (fixed names on a shared, cleaned broker).
@pytest.mark.parametrize("make_driver", EVERY_BROKER, indirect=True)
async def test_agent_error_goes_to_dlq_and_the_agent_goes_on(make_driver: DriverFactory) -> None:
    app = flowkit.App("e")
    nums = app.topic("nums", value_type=int)
    ok: list[int] = []

    @app.agent(nums)
    async def picky(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            if n == 3:
                raise ValueError("three is bad")
            ok.append(n)

    async with make_driver(app) as driver:
        for i in range(6):
            await driver.send(nums, i, key="k")
        await driver.run_until_idle()
        assert ok == [0, 1, 2, 4, 5]
        [dead] = await driver.dead_letters()
        headers = dict(dead.headers)
        assert dead.value == b"3" and dead.key == b"k"
        assert headers["flowkit.error.type"] == b"ValueError"
        assert headers["flowkit.error.message"] == b"three is bad"
        assert headers["flowkit.error.stage"] == b"process"
        assert headers["flowkit.source.topic"] == b"nums"
        assert headers["flowkit.source.offset"] == b"3"
        assert headers["flowkit.agent"] == b"picky"
        assert b"three is bad" in headers["flowkit.error.traceback"]
        assert driver.worker.metrics.errors.labels("picky", "process")._value.get() == 1


# On librdkafka too: its records reach the loop as its own messages (RawMessages), and
# the dead letter is made from the one that failed, headers and offset included.
@pytest.mark.parametrize("make_driver", ALL_CLIENTS, indirect=True)
async def test_undecodable_records_go_to_dlq_untouched(make_driver: DriverFactory) -> None:
    app, views, out = make_app()

    @app.agent(views, sink=[out], per_record=True)
    def user(view: View) -> str:
        return view.user

    async with make_driver(app) as driver:
        await driver.send_raw(views, b'{"user": "a", "page": "/", "kind": "view"}', partition=0)
        await driver.send_raw(
            views, b"not json", key=b"bad", partition=0, headers=(("trace", b"t1"),)
        )
        await driver.send_raw(views, b'{"user": 1}', partition=0)
        await driver.send_raw(views, b'{"user": "b", "page": "/", "kind": "view"}', partition=0)
        await driver.run_until_idle()
        assert sorted(await driver.values(out)) == ["a", "b"]
        dead = await driver.dead_letters()
        assert [d.value for d in dead] == [b"not json", b'{"user": 1}']
        first = dict(dead[0].headers)
        assert dead[0].key == b"bad" and first["trace"] == b"t1"
        assert first["flowkit.error.stage"] == b"decode"
        assert first["flowkit.error.type"] == b"DecodeError"
        assert first["flowkit.source.offset"] == b"1"


async def test_a_record_that_does_not_decode_is_one_dead_letter_for_all_readers() -> None:
    app, views, _ = make_app()
    seen: list[str] = []

    @app.agent(views, dead_letter="views-bad")
    async def first(stream: flowkit.Stream[View]) -> None:
        async for view in stream:
            seen.append(f"first {view.user}")

    @app.agent(views)
    async def second(stream: flowkit.Stream[View]) -> None:
        async for view in stream:
            seen.append(f"second {view.user}")

    with structlog.testing.capture_logs() as logs:
        async with TestDriver(app) as driver:
            await driver.send_raw(views, b"{not json", partition=0)
            await driver.send_raw(views, b'{"user": "a", "page": "/", "kind": "view"}', partition=0)
            await driver.run_until_idle()
            dead = await driver.messages("views-bad")
            assert await driver.dead_letters() == []  # not also in the app's dead-letter topic
            errors = driver.worker.metrics.errors
            assert errors.labels("first", "decode")._value.get() == 1
            assert errors.labels("second", "decode")._value.get() == 0
    assert sorted(seen) == ["first a", "second a"]  # both readers went on with the next one
    assert [d.value for d in dead] == [b"{not json"]
    headers = dict(dead[0].headers)
    assert headers["flowkit.agent"] == b"first"  # the first declared reader sends it
    message = headers["flowkit.error.message"].decode()
    assert message.startswith("JSON is malformed")  # the type is named once, by the header
    lines = [line for line in logs if line["log_level"] != "debug"]
    assert [(line["event"], line["agent"]) for line in lines] == [("record failed", "first")]
    assert lines[0]["error"] == f"DecodeError({message!r})"


async def test_fail_fast_raises_the_processing_error(make_driver: DriverFactory) -> None:
    app = flowkit.App("ff")
    nums = app.topic("nums", value_type=int)

    @app.agent(nums)
    async def boom(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            raise KeyError("nope")

    driver = make_driver(app, fail_fast=True)
    async with driver:
        await driver.send(nums, 1)
        with pytest.raises(KeyError):
            await driver.run_until_idle()


@pytest.mark.parametrize("make_driver", ALL_CLIENTS, indirect=True)
async def test_restart_resumes_from_committed_offsets(make_driver: DriverFactory) -> None:
    seen: list[int] = []

    def build() -> tuple[flowkit.App, flowkit.Topic[int]]:
        app = flowkit.App("r")
        nums = app.topic("nums", value_type=int, partitions=2)

        @app.agent(nums)
        async def remember(stream: flowkit.Stream[int]) -> None:
            async for n in stream:
                seen.append(n)

        return app, nums

    app, nums = build()
    async with make_driver(app) as driver:
        for i in range(10):
            await driver.send(nums, i)
        await driver.run_until_idle()
    app, nums = build()
    async with make_driver(app) as driver:
        for i in range(10, 15):
            await driver.send(nums, i)
        await driver.run_until_idle()
    assert sorted(seen) == list(range(15))  # nothing twice, nothing lost


async def test_uncommitted_records_are_redelivered_after_a_crash(
    make_driver: DriverFactory,
) -> None:
    seen: list[int] = []
    app = flowkit.App("crash", commit_interval=3600)
    nums = app.topic("nums", value_type=int)

    @app.agent(nums)
    async def remember(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            seen.append(n)

    driver = make_driver(app)
    await driver.__aenter__()
    for i in range(5):
        await driver.send(nums, i)
    await driver.run_until_idle()
    # A crash: the worker's tasks die without the final commit.
    driver.worker._error = RuntimeError("simulated crash")
    await driver.aclose()
    again = flowkit.App("crash")
    nums2 = again.topic("nums", value_type=int)

    @again.agent(nums2)
    async def remember2(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            seen.append(n)

    async with make_driver(again) as d2:
        await d2.run_until_idle()
    assert seen == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


async def test_timers_and_tasks_follow_the_fake_clock() -> None:
    app = flowkit.App("tm")
    ticks: list[float] = []
    started: list[bool] = []
    clock = FakeClock()

    @app.timer(1.0)
    async def tick() -> None:
        ticks.append(clock.monotonic())

    @app.task
    async def once() -> None:
        started.append(True)

    async with TestDriver(app, clock=clock) as driver:
        await driver.advance(3.5)
    assert ticks == [1.0, 2.0, 3.0] and started == [True]


async def test_commit_interval_commits_on_the_clock() -> None:
    app = flowkit.App("ci", commit_interval=5.0)
    nums = app.topic("nums", value_type=int)

    @app.agent(nums)
    async def sink(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            pass

    async with TestDriver(app) as driver:
        await driver.send(nums, 1)
        await driver.run_until_idle()
        tp = flowkit.TopicPartition("nums", 0)
        assert driver.broker.committed("ci", tp) is None
        await driver.advance(5.0)
        assert driver.broker.committed("ci", tp) == 1


async def test_agent_that_returns_early_is_restarted_on_the_rest(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("ret")
    nums = app.topic("nums", value_type=int)
    seen: list[int] = []

    @app.agent(nums)
    async def one_at_a_time(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            seen.append(n)
            break

    async with make_driver(app) as driver:
        for i in range(4):
            await driver.send(nums, i)
        await driver.run_until_idle()
    assert seen == [0, 1, 2, 3]


# On librdkafka too: an output's origin carries the client's own record, made a Message
# when the sink takes it.
@pytest.mark.parametrize("make_driver", ALL_CLIENTS, indirect=True)
async def test_callable_sink_failure_is_a_sink_stage_dead_letter(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("cs")
    nums = app.topic("nums", value_type=int)

    def flaky(n: int) -> None:
        if n == 2:
            raise OSError("disk full")

    @app.agent(nums, sink=[flaky], per_record=True)
    def passthrough(n: int) -> int:
        return n

    async with make_driver(app) as driver:
        for i in range(4):
            await driver.send(nums, i)
        await driver.run_until_idle()
        [dead] = await driver.dead_letters()
        assert dict(dead.headers)["flowkit.error.stage"] == b"sink"
        assert dead.value == b"2"


async def test_the_app_is_frozen_once_a_worker_starts() -> None:
    app = flowkit.App("fr")
    async with TestDriver(app):
        with pytest.raises(RuntimeError, match="frozen"):
            app.topic("late")
    with pytest.raises(RuntimeError, match="frozen"):
        app.topic("after")  # for good: a declaration never changes under a worker


async def test_topic_send_outside_a_worker_is_a_clear_error() -> None:
    app = flowkit.App("nr")
    nums = app.topic("nums", value_type=int)
    with pytest.raises(flowkit.NotRunningError, match="inside a running worker"):
        await nums.send(1)


def test_declaration_errors() -> None:
    app = flowkit.App("d")
    nums = app.topic("nums", value_type=int)
    with pytest.raises(flowkit.DefinitionError, match="async def"):
        app.agent(nums)(lambda stream: None)
    with pytest.raises(flowkit.DefinitionError, match="concurrency"):

        @app.agent(nums, concurrency=0)
        async def a(stream: Any) -> None: ...

    with pytest.raises(flowkit.DefinitionError, match="name"):
        flowkit.App("bad name")
    with pytest.raises(flowkit.DefinitionError, match="partitions"):
        app.topic("x", partitions=0)


async def test_graph_problems_stop_the_worker_before_it_starts() -> None:
    app = flowkit.App("g")

    @app.agent("missing")
    async def reader(stream: Any) -> None: ...

    with pytest.raises(flowkit.GraphError, match="never declared"):
        async with TestDriver(app):
            pass
