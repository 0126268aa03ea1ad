"""Hostile records through agents on the memory broker, every agent under a ``Retry``
policy: a value that does not decode is dead-lettered once, at stage ``decode`` as a
``DecodeError``, never retried; a key that does not decode reaches the agent as its
bytes; the records around them are processed and the worker never stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.deadletter import DeadLetter
from flowkit.testing import TestDriver
from flowkit.topics import Topic
from tests.hostile import hostile, hostile_json

RETRY = {Exception: flowkit.Retry(attempts=3, backoff=0.001)}
# Nesting deep enough for msgspec's RecursionError: in a value, where a record skips an
# unknown field, and in a key of any type with lists or objects.
DEEP = [b'{"a":' * 1_000 + b"1" + b"}" * 1_000, b'{"id": "x", "amount": 1, "a": ' + b"[" * 100_000]
CASES = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


class Order(flowkit.Record):
    id: str
    amount: int


def decoded(topic: Topic[Any], data: bytes) -> list[Any]:
    """[the value] if ``data`` decodes, else []."""
    try:
        return [topic.decode(data)]
    except flowkit.DecodeError:
        return []


async def run(
    app: flowkit.App, topic: Topic[Order], bad: list[bytes]
) -> tuple[TestDriver, list[str], int]:
    """Send good orders with the hostile values between them and run until idle: the
    driver, the ids the agent should see, and how many values do not decode."""
    want: list[str] = []
    async with TestDriver(app) as driver:
        for i, data in enumerate(bad):
            await driver.send(topic, Order(id=f"good-{i}", amount=i), key="k")
            await driver.send_raw(topic, data, key=b"k")
            want += [f"good-{i}", *(order.id for order in decoded(topic, data))]
        await driver.send(topic, Order(id="last", amount=99), key="k")
        await driver.run_until_idle()
        return driver, [*want, "last"], sum(not decoded(topic, data) for data in bad)


async def check_dead_letters(driver: TestDriver, agent: str, expected: int) -> None:
    letters = [DeadLetter(m) for m in await driver.dead_letters()]
    assert [(d.stage, d.error_type, d.agent) for d in letters] == [
        ("decode", "DecodeError", agent)
    ] * expected
    assert all(d.meta["attempts"] == "1" for d in letters)
    assert driver.worker.metrics.retries.labels(agent)._value.get() == 0
    assert driver.worker.error is None


def orders_app() -> tuple[flowkit.App, Topic[Order]]:
    app = flowkit.App("hostile")
    return app, app.topic("orders", value_type=Order)


Shape = Callable[[flowkit.App, Topic[Order], list[str]], None]


def plain(app: flowkit.App, orders: Topic[Order], seen: list[str]) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            seen.append(order.id)


def chained(app: flowkit.App, orders: Topic[Order], seen: list[str]) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        async for oid in stream.filter(lambda o: o.amount >= 0).map(lambda o: o.id):
            seen.append(oid)


def events(app: flowkit.App, orders: Topic[Order], seen: list[str]) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        async for event in stream.events():
            seen.append(event.value.id)


def per_record(app: flowkit.App, orders: Topic[Order], seen: list[str]) -> None:
    @app.agent(orders, on_error=RETRY, per_record=True)
    async def take_orders(order: Order) -> None:
        seen.append(order.id)


def regrouped(app: flowkit.App, orders: Topic[Order], seen: list[str]) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        async for order in stream.group_by(lambda o: o.id, name="by-id"):
            seen.append(order.id)


def in_lists(app: flowkit.App, orders: Topic[Order], seen: list[str]) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        async for chunk in stream.take(1, within=1.0):
            seen.extend(order.id for order in chunk)


def _shape_test(shape: Shape) -> Any:
    @CASES
    @given(bad=st.lists(hostile, min_size=1, max_size=3))
    @example(bad=DEEP)
    def test(bad: list[bytes]) -> None:
        app, orders = orders_app()
        seen: list[str] = []
        shape(app, orders, seen)

        async def main() -> None:
            driver, want, expected = await run(app, orders, bad)
            assert sorted(seen) == sorted(want), "a good record was lost or repeated"
            await check_dead_letters(driver, "take_orders", expected)

        asyncio.run(main())

    return test


test_async_for = _shape_test(plain)
test_filter_and_map = _shape_test(chained)
test_events = _shape_test(events)
test_per_record = _shape_test(per_record)
test_group_by = _shape_test(regrouped)


@CASES
@given(keys=st.lists(hostile_json, min_size=1, max_size=3))
@example(keys=[b"[" * 1_000 + b"]" * 1_000, *DEEP])
def test_a_key_that_does_not_decode_reaches_the_agent_as_its_bytes(keys: list[bytes]) -> None:
    asyncio.run(_keys(keys))


async def _keys(keys: list[bytes]) -> None:
    # The shape of issue 26: deeply nested keys read through events() raised
    # RecursionError in the agent (stage "process"), and the Retry policy retried them.
    app = flowkit.App("hostile-keys")
    numbers = app.topic("numbers", value_type=int, key_type=Any)
    got: list[tuple[Any, int]] = []

    @app.agent(numbers, on_error=RETRY)
    async def take_numbers(stream: flowkit.Stream[int]) -> None:
        async for event in stream.events():
            got.append((event.key, event.value))

    async with TestDriver(app) as driver:
        for i, key in enumerate(keys):
            await driver.send_raw(numbers, numbers.encode(i), key=key)
        await driver.run_until_idle()
        assert [n for _, n in got] == list(range(len(keys)))
        for (key, _), data in zip(got, keys, strict=True):
            assert key == (
                data if undecodable_key(numbers, data) else numbers.key_codec.decode(data)
            )
        await check_dead_letters(driver, "take_numbers", 0)


def undecodable_key(topic: Topic[Any], data: bytes) -> bool:
    try:
        topic.key_codec.decode(data)
    except flowkit.DecodeError:
        return True
    return False


async def test_deep_nesting_through_a_join_is_dead_lettered_at_decode() -> None:
    app = flowkit.App("hostile-join")
    left = app.topic("left", value_type=Order)
    right = app.topic("right", value_type=Order)
    pairs = app.join(left, right, name="pairs", within=60.0)
    got: list[Any] = []

    @app.agent(pairs, on_error=RETRY)
    async def take_pairs(stream: flowkit.Stream[flowkit.Joined]) -> None:
        async for joined in stream:
            got.append((joined.left.id, joined.right.id))

    async with TestDriver(app) as driver:
        await driver.send(left, Order(id="l", amount=1), key="k")
        await driver.send_raw(left, b"[" * 50_000, key=b"k")
        await driver.send_raw(right, b'{"id": "r", "amount": ' + b"9" * 5_000 + b"}", key=b"k")
        await driver.send(right, Order(id="r", amount=2), key="k")
        await driver.run_until_idle()
        assert got == [("l", "r")]
        await check_dead_letters(driver, "take_pairs", 2)


async def test_deep_nesting_in_a_batch_of_take_is_dead_lettered_at_decode() -> None:
    app, orders = orders_app()
    seen: list[str] = []
    in_lists(app, orders, seen)
    bad = [b"[" * 100_000, *DEEP]
    driver, want, expected = await run(app, orders, bad)
    assert expected == 3
    assert sorted(seen) == sorted(want)
    await check_dead_letters(driver, "take_orders", 3)


Walker = Callable[[flowkit.App, Topic[Order], list[str], list[int]], None]


def walk_group_by(
    app: flowkit.App, orders: Topic[Order], seen: list[str], starts: list[int]
) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        starts.append(1)
        async for order in stream.group_by(lambda o: "one", name="by-one"):
            seen.append(order.id)


def walk_take(app: flowkit.App, orders: Topic[Order], seen: list[str], starts: list[int]) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        starts.append(1)
        async for chunk in stream.take(10, within=1.0):
            seen.extend(order.id for order in chunk)


def walk_batches(
    app: flowkit.App, orders: Topic[Order], seen: list[str], starts: list[int]
) -> None:
    @app.agent(orders, on_error=RETRY)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        starts.append(1)
        async for chunk in stream.filter(lambda o: o.amount >= 0).batches(10, 0.05):
            seen.extend(order.id for order in chunk)


@pytest.mark.parametrize("walker", [walk_group_by, walk_take, walk_batches])
async def test_a_bad_record_is_dead_lettered_in_place_by_every_walker(walker: Walker) -> None:
    # Every way of walking a batch treats a record that does not decode as the compiled
    # loop does: dead-lettered where it was found, once, and the agent is not started
    # again (which would cost it its local state, and a list its values so far).
    app, orders = orders_app()
    seen: list[str] = []
    starts: list[int] = []
    walker(app, orders, seen, starts)
    driver, want, expected = await run(app, orders, [b"not json", b"{", b"[]"])
    assert sorted(seen) == sorted(want), "a good record was lost or repeated"
    await check_dead_letters(driver, "take_orders", expected)
    assert len(starts) == 1, f"the agent was started {len(starts)} times"


async def test_a_bad_record_in_a_join_is_dead_lettered_in_place() -> None:
    app = flowkit.App("hostile-join-walk")
    left = app.topic("left", value_type=Order)
    right = app.topic("right", value_type=Order)
    pairs = app.join(left, right, name="pairs", within=60.0)
    got: list[Any] = []
    starts: list[int] = []

    @app.agent(pairs, on_error=RETRY)
    async def take_pairs(stream: flowkit.Stream[flowkit.Joined]) -> None:
        starts.append(1)
        async for joined in stream:
            got.append((joined.left.id, joined.right.id))

    async with TestDriver(app) as driver:
        await driver.send(left, Order(id="l1", amount=1), key="k")
        await driver.send_raw(left, b"not json", key=b"k")
        await driver.send(left, Order(id="l2", amount=1), key="k")
        await driver.send_raw(right, b"{", key=b"k")
        await driver.send(right, Order(id="r", amount=2), key="k")
        await driver.run_until_idle()
        assert sorted(got) == [("l1", "r"), ("l2", "r")]
        await check_dead_letters(driver, "take_pairs", 2)
    assert len(starts) == 1, f"the agent was started {len(starts)} times"


def _checked(order: Order) -> Order:
    if order.id.startswith("bad"):
        raise ValueError(f"refused {order.id}")
    return order


@pytest.mark.parametrize("shape", ["take", "batches"])
@pytest.mark.parametrize("policy", [None, RETRY], ids=["default", "retry"])
async def test_an_operator_raising_in_a_list_fails_its_record_and_the_list_goes_on(
    shape: str, policy: Any
) -> None:
    # A value whose map() raises while a list is filled is failed where it is, as a
    # record of a list (a Retry's ``then``: it cannot be processed again there); the
    # values the list holds stay, the agent is not started again, and every offset is
    # committed.
    app = flowkit.App("hostile-list-ops", partitions=1)
    orders = app.topic("orders", value_type=Order)
    seen: list[str] = []
    starts: list[int] = []

    @app.agent(orders, on_error=policy)
    async def take_orders(stream: flowkit.Stream[Order]) -> None:
        starts.append(1)
        checked = stream.map(_checked)
        lists = checked.take(4, 0.05) if shape == "take" else checked.batches(4, 0.05)
        async for chunk in lists:
            seen.extend(order.id for order in chunk)

    want: list[str] = []
    async with TestDriver(app) as driver:
        for i in range(10):
            await driver.send(orders, Order(id=f"good-{i}", amount=i), key="k")
            want.append(f"good-{i}")
            if i % 3 == 1:
                await driver.send(orders, Order(id=f"bad-{i}", amount=i), key="k")
        await driver.advance(1.0)  # the last list's time is up
        await driver.run_until_idle()
        assert sorted(seen) == sorted(want), "a good value was lost or repeated"
        letters = [DeadLetter(m) for m in await driver.dead_letters()]
        assert [(d.stage, d.error_type, d.agent) for d in letters] == [
            ("process", "ValueError", "take_orders")
        ] * 3
        assert sorted(DeadLetter(m).source_offset for m in await driver.dead_letters()) == [
            2,
            6,
            10,
        ]
        await driver.worker.checkpoint()
        assert driver.broker.committed(app.name, flowkit.TopicPartition("orders", 0)) == 13
    assert len(starts) == 1, f"the agent was started {len(starts)} times"
