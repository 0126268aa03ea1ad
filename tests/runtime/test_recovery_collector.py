"""The garbage collector is off while tables recover, and back as it was afterwards."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from flowkit.runtime.recovery import collector_paused
from flowkit.testing import TestDriver
from flowkit.transports import MemoryBroker
from tests.ops.webapp import Click, build


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_nested_pauses_end_with_the_last(collector_on: None) -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # a second worker recovering in the same process
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_user_stays_off(collector_on: None) -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_a_failing_recovery_turns_the_collector_back_on(collector_on: None) -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("broker gone")
    assert gc.isenabled()


async def test_the_collector_is_off_while_changelog_batches_are_applied(
    collector_on: None,
) -> None:
    app = build("gcdemo")
    clicks = app.topics["clicks"]
    broker = MemoryBroker()
    async with TestDriver(app, broker=broker) as first:
        for i in range(20):
            await first.send(clicks, Click(f"u{i}"), key=f"u{i}")
        await first.run_until_idle()
    second = TestDriver(app, broker=broker)
    seen: list[bool] = []
    second.worker.state.recovery.listeners.append(
        lambda recovery: seen.append(recovery.active and gc.isenabled())
    )
    async with second:
        await second.run_until_idle()
        assert second.worker.state.recovery.done >= 20
    assert seen and not any(seen)  # no batch was applied with the collector on
    assert gc.isenabled()
