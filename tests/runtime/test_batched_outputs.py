"""Outputs leave in batches per destination partition, and bad records are cheap.

Outputs keep Kafka's placement (murmur2 of the key) and each key's order; a burst of bad
records logs a few lines and a summary, while every one of them is counted and
dead-lettered. Run on the memory broker and on the Kafka test broker.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from structlog.testing import capture_logs

import flowkit
from flowkit.deadletter import TRACEBACK_FRAMES, DeadLetter
from flowkit.partitioning import partition_for_key
from tests.conftest import DriverFactory


def _router() -> tuple[flowkit.App, flowkit.Topic[Any], list[flowkit.Topic[Any]]]:
    name = f"batched-{uuid.uuid4().hex[:8]}"
    app = flowkit.App(name)
    orders = app.topic(f"{name}-in", value_type=dict, partitions=2)
    outs = [app.topic(f"{name}-out{i}", value_type=dict, partitions=3) for i in range(2)]
    names = tuple(t.name for t in outs)

    @app.agent(orders, sink=outs)
    async def fan_out(stream: flowkit.Stream[dict[str, Any]]) -> AsyncIterator[Any]:
        async for order in stream:
            if order["n"] % 3 == 0:
                yield flowkit.Output(order, to=names)  # both topics, the input's key
            else:
                yield flowkit.Output({**order, "half": True}, key=None, to=names[:1])

    return app, orders, outs


async def test_outputs_land_on_the_key_partition_in_order(make_driver: DriverFactory) -> None:
    app, orders, outs = _router()
    async with make_driver(app) as driver:
        for n in range(300):
            await driver.send(orders, {"n": n}, key=f"k{n % 7}")
        await driver.run_until_idle()
        first = await driver.messages(outs[0])
        second = await driver.messages(outs[1])
    for p in range(3):
        offsets = [m.offset for m in second if m.partition == p]
        assert offsets == list(range(len(offsets)))  # nothing lost or doubled
    keyed = [m for m in first if m.key is not None]
    assert len(keyed) == 100 and len(second) == 100 and len(first) == 300
    for m in [*keyed, *second]:
        assert m.key is not None and m.partition == partition_for_key(m.key, 3)
    decode = outs[0].decode
    for key in {m.key for m in second}:
        numbers = [decode(m.value or b"")["n"] for m in second if m.key == key]
        assert numbers == sorted(numbers)  # one key, one partition: in input order
    keyless = [decode(m.value or b"")["n"] for m in first if m.key is None]
    assert sorted(keyless) == [n for n in range(300) if n % 3]


async def test_a_burst_of_bad_records_logs_a_few_lines_and_dead_letters_every_one(
    make_driver: DriverFactory,
) -> None:
    app, orders, outs = _router()
    with capture_logs() as logs:
        async with make_driver(app) as driver:
            for n in range(200):
                await driver.send(orders, {"n": n}, key=f"k{n}")
                await driver.send(orders, {"no_n": n}, key=f"bad{n}")  # KeyError in the agent
            await driver.run_until_idle()
            await driver.worker.checkpoint()
            letters = [DeadLetter(m) for m in await driver.dead_letters()]
            outputs = await driver.values(outs[0]) + await driver.values(outs[1])
            metrics = driver.worker.metrics
            budget = driver.worker.dispatcher.log_budget  # type: ignore[union-attr]
    assert len(outputs) == 200 + 67  # every good record's outputs, nothing lost
    assert len(letters) == 200 and {letter.error_type for letter in letters} == {"KeyError"}
    assert metrics.errors.labels("fan_out", "process")._value.get() == 200
    assert metrics.dead_letters.labels("process")._value.get() == 200
    failed = [e for e in logs if e["event"] == "record failed"]
    assert len(failed) == budget.burst
    [summary] = [e for e in logs if e["event"].startswith("more records failed than logged")]
    assert summary["not_logged"] == 200 - budget.burst and summary["kind"] == "fan_out"
    trace = letters[0].meta["error.traceback"]
    assert trace.splitlines()[-1] == "KeyError: 'n'"
    assert trace.count('  File "') <= TRACEBACK_FRAMES
    assert "^^^" not in trace


async def test_outputs_to_a_topic_first_named_at_run_time_are_placed_by_key(
    make_driver: DriverFactory,
) -> None:
    # Not among the agent's sinks: its partition count is asked by the first flush, and the
    # outputs published before it is known are placed then, ahead of the later ones.
    name = f"late-{uuid.uuid4().hex[:8]}"
    app = flowkit.App(name)
    orders = app.topic(f"{name}-in", value_type=int, partitions=1)
    late = app.topic(f"{name}-late", value_type=int, partitions=3)

    @app.agent(orders, per_record=True)
    def route(n: int) -> flowkit.Output:
        return flowkit.Output(n, to=late.name)

    async with make_driver(app) as driver:
        for n in range(60):
            await driver.send(orders, n, key=f"k{n % 5}")
        await driver.run_until_idle()
        got = await driver.messages(late)
    assert len(got) == 60
    for m in got:
        assert m.key is not None and m.partition == partition_for_key(m.key, 3)
    for key in {m.key for m in got}:
        numbers = [late.decode(m.value or b"") for m in got if m.key == key]
        assert numbers == sorted(numbers)
