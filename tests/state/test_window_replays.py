"""A window result that a restart emits again is marked: a ``flowkit.replayed`` header on
its ``to=`` record, and ``replayed=True`` for an ``on_close`` that takes it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import flowkit
from flowkit.records import Message
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from flowkit.windows import Window, WindowResult
from tests.conftest import WindowStores

# The same suite on each store of windowed tables (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("window_store")


class Click(flowkit.Record):
    page: str
    t: int  # ms


Closed = tuple[str, int, int, bool]  # key, window start, value, replayed


def make_app(closed: list[Closed]) -> tuple[flowkit.App, flowkit.Topic[Click]]:
    app = flowkit.App("replays", partitions=1)
    clicks: flowkit.Topic[Click] = app.topic("clicks", value_type=Click)
    out: flowkit.Topic[WindowResult] = app.topic("page-counts", value_type=WindowResult)

    def report(page: str, window: Window, views: int, replayed: bool = False) -> None:
        closed.append((page, window.start, views, replayed))

    counts = app.table("counts", default=int).tumbling(
        10.0, grace=0.0, time=lambda c: c.t, idle_timeout=None, to=out, on_close=report
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts.add(click.page, 1)

    return app, clicks


async def feed(driver: TestDriver, clicks: flowkit.Topic[Click], times: list[int]) -> None:
    for t in times:
        await driver.send(clicks, Click("/", t), key="/", timestamp_ms=t)
        await driver.run_until_idle()


def results(broker: MemoryBroker) -> list[tuple[int, Any, bool]]:
    out = []
    for m in broker.messages("page-counts", 0):
        assert m.value is not None
        value = msgspec.json.decode(m.value, type=WindowResult)
        out.append((value.start, value.value, ("flowkit.replayed", b"true") in m.headers))
    return out


async def test_a_window_emitted_again_after_a_crash_is_marked_and_a_new_one_is_not(
    window_store: WindowStores,
) -> None:
    broker = MemoryBroker()
    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    start = now - now % 10_000
    closed: list[Closed] = []
    app, clicks = make_app(closed)
    driver = TestDriver(app, broker=broker, clock=clock, commit_interval=3600)
    await driver.__aenter__()
    await feed(driver, clicks, [start + 1, start + 2, start + 10_001])
    assert results(broker) == [(start, 2, False)]
    assert closed == [("/", start, 2, False)]
    driver.worker._error = RuntimeError("simulated crash")  # no final commit, no flush
    await driver.aclose()

    if window_store.kind == "rocksdb":
        # On disk a window closes in steps, each in a checkpoint of its own, at once: the
        # crash came after that commit, so nothing comes again (tests/state/
        # test_disk_close.py crashes inside the checkpoint).
        async with TestDriver(app, broker=broker, clock=clock) as again:
            await again.run_until_idle()
            assert results(broker) == [(start, 2, False)]
        return
    # The successor reads every record again: the first window closes a second time.
    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        assert results(broker) == [(start, 2, False), (start, 2, True)]
        await feed(again, clicks, [start + 20_001])  # closes the second window: new
    assert results(broker)[2:] == [(start + 10_000, 1, False)]
    assert closed == [
        ("/", start, 2, False),
        ("/", start, 2, True),
        ("/", start + 10_000, 1, False),
    ]


async def test_an_on_close_without_the_parameter_is_called_as_before() -> None:
    calls: list[tuple[Any, ...]] = []
    app = flowkit.App("plain", partitions=1)
    clicks: flowkit.Topic[Click] = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).tumbling(
        10.0,
        grace=0.0,
        time=lambda c: c.t,
        idle_timeout=None,
        on_close=lambda *args: calls.append(args),
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts.add(click.page, 1)

    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    start = now - now % 10_000
    async with TestDriver(app, clock=clock) as driver:
        await feed(driver, clicks, [start + 1, start + 10_001])
    assert calls == [("/", Window(start, start + 10_000), 1)]


def test_the_changelog_record_of_closes_is_checked() -> None:
    app, _ = make_app([])
    table = app.tables["counts"]
    store = table.new_store(lambda: 0)
    store.apply_changelog(0, [Message("c", 0, 0, 0, b'["e"]', b"7")])
    assert store.owners.owners[0].emitted_through == 7
    for bad in (b'"seven"', b"null", b"[1]", b"true"):  # anyone may write a changelog: not trusted
        store.apply_changelog(0, [Message("c", 0, 0, 0, b'["e"]', bad)])
        assert store.owners.owners[0].emitted_through == -1
