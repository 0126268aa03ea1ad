"""A table's changelog and a global table's topic are topics anyone with produce rights
can write: a record there that does not decode is dead-lettered (the key keeps the value
it had), at load, while following, and in recovery; the worker never stops for one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport

ODD = [b"not json", b"[" * 5000 + b"]" * 5000, b"", b'{"a": 1}']


def app_with() -> tuple[flowkit.App, Any, Any, Any]:
    app = flowkit.App("tt", partitions=1)
    prices = app.global_table("prices", value_type=int)
    orders = app.topic("orders", value_type=str)
    out = app.topic("priced", value_type=int)
    totals = app.table("totals", default=int, value_type=int)

    @app.agent(orders, sink=[out])
    async def price(stream: flowkit.Stream[str]) -> AsyncIterator[int]:
        async for item in stream:
            totals[item] += 1
            yield prices.get(item) or 0

    return app, prices, orders, out


async def seed(broker: MemoryBroker, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    transport = MemoryTransport(broker)
    producer = transport.producer()
    await producer.start()
    for key, value in records:
        await (await producer.send(topic, value, key=key, partition=0))
    await transport.aclose()


async def test_a_global_tables_topic_with_records_that_do_not_decode() -> None:
    broker = MemoryBroker()
    await seed(broker, "prices", [(b"a", b"1"), *[(b"a", v) for v in ODD], (b"b", b"2")])
    app, _, orders, out = app_with()
    async with TestDriver(app, broker=broker) as driver:
        await driver.send(orders, "a")
        await driver.send(orders, "b")
        await driver.run_until_idle()
        await driver.send_raw("prices", b"{", key=b"b")  # while following the topic
        await driver.send_raw("prices", b"5", key=b"c")
        await driver.send(orders, "b")
        await driver.run_until_idle()
        await driver.send(orders, "c")
        await driver.run_until_idle()
        assert await driver.values(out) == [1, 2, 2, 5]
        letters = await driver.dead_letters()
    assert sorted(m.value or b"" for m in letters) == sorted([*ODD, b"{"])
    for letter in letters:
        headers = dict(letter.headers)
        assert headers["flowkit.agent"] == b"table:prices"
        assert headers["flowkit.error.type"] == b"DecodeError"


async def test_a_changelog_with_records_that_do_not_decode() -> None:
    broker, clock = MemoryBroker(), FakeClock()
    app, _, orders, _ = app_with()
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        for item in ("x", "x", "y"):
            await driver.send(orders, item)
        await driver.run_until_idle()
    # And one without a key (Tansu takes it on a compacted topic): no table key at all.
    await seed(broker, "tt-totals-changelog", [*[(b"x", v) for v in ODD], (None, b"9")])
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await driver.send(orders, "x")
        await driver.run_until_idle()
        store = driver.store(app.tables["totals"])
        assert (store["x"], store["y"]) == (3, 1)
        dead = await driver.dead_letters()
        letters = [m for m in dead if m.value in ODD or m.value == b""]
    assert len(letters) == len(ODD)
    assert [m.key for m in dead if m.value == b"9"] == [None]
