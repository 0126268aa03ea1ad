"""stream.through(topic): forwarded to a declared topic and read back from it, on both
brokers; found at declaration; shown by the graph; at-least-once across a crash."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from typer.testing import CliRunner

import flowkit
from flowkit.cli import cli
from flowkit.partitioning import partition_for_key
from flowkit.records import Headers
from flowkit.testing import TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from flowkit.transports.memory import MemoryProducer
from tests.conftest import DriverFactory


class Raw(flowkit.Record):
    sensor: str
    tenths: int


class Reading(flowkit.Record):
    sensor: str
    celsius: float


def make_app(
    seen: list[tuple[str, int, str, float]] | None = None,
) -> tuple[flowkit.App, flowkit.Topic[Raw], flowkit.Topic[Reading], flowkit.Topic[str], Any]:
    """One partition in, four through: a table keyed by sensor is written on its own
    partition, by the one of two agent instances that owns it."""
    app = flowkit.App("thru", partitions=4, commit_interval=3600)
    raw = app.topic("raw", value_type=Raw, partitions=1)
    readings = app.topic("readings", value_type=Reading)
    out = app.topic("out", value_type=str)
    last = app.table("last")
    log = seen if seen is not None else []

    @app.agent(raw, sink=[out], concurrency=2)
    async def hop(stream: flowkit.Stream[Raw]) -> AsyncIterator[str]:
        kept = stream.filter(lambda r: r.tenths >= 0)
        async for event in kept.map(to_reading).through(readings).events():
            reading = event.value
            last[reading.sensor] = reading.celsius  # raises if not on the sensor's partition
            log.append((event.topic, event.partition, reading.sensor, reading.celsius))
            yield f"{reading.sensor}={reading.celsius}"

    return app, raw, readings, out, last


def to_reading(raw: Raw) -> Reading:
    return Reading(raw.sensor, raw.tenths / 10)


async def test_through_forwards_each_value_and_reads_it_back(make_driver: DriverFactory) -> None:
    seen: list[tuple[str, int, str, float]] = []
    app, raw, readings, out, last = make_app(seen)
    sent = [Raw(f"s{i % 6}", i if i % 5 else -1) for i in range(30)]  # 6 filtered out
    async with make_driver(app) as driver:
        for i, r in enumerate(sent):
            await driver.send(
                raw, r, key=r.sensor, headers=(("trace", b"%d" % i),), timestamp_ms=1000 + i
            )
        await driver.run_until_idle()
        kept = [(i, r) for i, r in enumerate(sent) if r.tenths >= 0]
        forwarded = await driver.messages(readings)
        # Each kept value once, with its record's key, headers and timestamp, mapped.
        assert sorted((m.timestamp, m.key, m.headers) for m in forwarded) == [
            (1000 + i, r.sensor.encode(), (("trace", b"%d" % i),)) for i, r in kept
        ]
        assert all(m.partition == partition_for_key(m.key or b"", 4) for m in forwarded)
        # The loop saw only what came back from readings, each sensor in its order.
        assert {t for t, *_ in seen} == {"readings"}
        for sensor in {r.sensor for _, r in kept}:
            assert [c for _, _, s, c in seen if s == sensor] == [
                r.tenths / 10 for _, r in kept if r.sensor == sensor
            ]
        assert sorted(await driver.values(out)) == sorted(
            f"{r.sensor}={r.tenths / 10}" for _, r in kept
        )
        store = driver.store(last)
        assert {k: store[k] for k in store} == {r.sensor: r.tenths / 10 for _, r in kept}


async def test_a_crash_forwards_again_what_was_not_committed(make_driver: DriverFactory) -> None:
    """A run that crashes, then one that stops cleanly: the crashed run's records are
    forwarded twice, and the loop sees each of their copies once per run that read it;
    the records after the restart, once."""
    seen: list[tuple[str, int, str, float]] = []

    async def run(first: int, last: int, *, crash: bool = False) -> list[Reading]:
        app, raw, readings, *_ = make_app(seen)
        driver = make_driver(app)
        await driver.__aenter__()
        for n in range(first, last):
            await driver.send(raw, Raw(f"s{n % 3}", n), key=f"s{n % 3}")
        await driver.run_until_idle()
        if crash:  # the worker's tasks die without the final commit
            driver.worker._error = RuntimeError("simulated crash")
        await driver.aclose()
        return await driver.values(readings)

    await run(0, 10, crash=True)
    forwarded = await run(10, 15)

    def counts(values: list[float]) -> dict[int, int]:
        out: dict[int, int] = {}
        for celsius in values:
            out[round(celsius * 10)] = out.get(round(celsius * 10), 0) + 1
        return out

    # On the topic: records 0-9 twice (forwarded again after the crash), 10-14 once.
    assert counts([r.celsius for r in forwarded]) == {n: 2 if n < 10 else 1 for n in range(15)}
    # The loop: 0-9 three times (the crashed run read its copies; the next run read them
    # again, as they were not committed, and then the second copies); 10-14 once.
    assert counts([c for *_, c in seen]) == {n: 3 if n < 10 else 1 for n in range(15)}


# -- the delivery rule: committed once the forwarded copy is acknowledged ----------------


class _HeldProducer(MemoryProducer):
    """Acknowledges sends to ``held`` only once the test releases them."""

    def __init__(self, broker: MemoryBroker, held: str, release: asyncio.Event) -> None:
        super().__init__(broker)
        self.held, self.release = held, release

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Any]:
        ack = await super().send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if topic != self.held:
            return ack

        async def later() -> Any:
            await self.release.wait()
            return await ack

        return asyncio.ensure_future(later())


class _HeldTransport(MemoryTransport):
    def __init__(self, held: str, release: asyncio.Event) -> None:
        super().__init__()
        self.held, self.release = held, release

    def producer(self, *, client_id: str = "flowkit") -> MemoryProducer:
        producer = _HeldProducer(self.broker, self.held, self.release)
        self._clients.append(producer)
        return producer


async def test_an_offset_is_committed_only_once_its_forward_is_acknowledged() -> None:
    app, raw, readings, *_ = make_app()
    release = asyncio.Event()
    transport = _HeldTransport(readings.name, release)
    tp = flowkit.TopicPartition(raw.name, 0)
    partition = partition_for_key(b"s1", 4)
    async with TestDriver(app, transport=transport) as driver:
        for n in range(3):
            await driver.send(raw, Raw("s1", n), key="s1")
        for _ in range(200):  # until the three records are forwarded (not acknowledged)
            await asyncio.sleep(0)
            if len(transport.broker.messages(readings.name, partition)) == 3:
                break
        checkpoint = asyncio.ensure_future(driver.worker.checkpoint())
        for _ in range(50):
            await asyncio.sleep(0)
        assert not checkpoint.done() and transport.broker.committed(app.name, tp) is None
        release.set()
        await checkpoint
        assert transport.broker.committed(app.name, tp) == 3
        await driver.run_until_idle()
    await transport.aclose()


# -- declaration -------------------------------------------------------------------------


def test_a_string_literal_or_a_topic_keyword_names_the_topic() -> None:
    app = flowkit.App("lit", partitions=2)
    src = app.topic("src", value_type=int)
    app.topic("dst", value_type=int)

    dst2 = app.topic("dst2", value_type=int)

    @app.agent(src)
    async def agent(stream: flowkit.Stream[int]) -> None:
        async for _ in stream.through("dst"):
            pass
        async for _ in stream.through(topic=dst2):
            pass

    assert list(agent.hops) == [("through", "dst"), ("through", "dst2")]
    assert agent.topic_names == ["src", "dst", "dst2"]


def test_a_topic_that_cannot_be_found_is_one_line_naming_the_agent() -> None:
    app = flowkit.App("bad", partitions=2)
    src = app.topic("src", value_type=int)
    not_a_topic = 42

    def declare(body: Callable[..., Any]) -> None:
        app.agent(src)(body)

    async def later(stream: flowkit.Stream[int]) -> None:
        async for _ in stream.through(dst):
            pass

    async def undeclared(stream: flowkit.Stream[int]) -> None:
        async for _ in stream.through("nowhere"):
            pass

    async def number(stream: flowkit.Stream[int]) -> None:
        async for _ in stream.through(not_a_topic):  # type: ignore[call-overload]
            pass

    async def own(stream: flowkit.Stream[int]) -> None:
        async for _ in stream.through(src):
            pass

    cases = [
        (later, "'dst' is not a name the agent's module or closure defines yet"),
        (undeclared, "no topic 'nowhere' is declared in this app before the agent"),
        (number, "'not_a_topic' is a int, not a topic"),
        (own, "goes back to a topic the agent reads"),
    ]
    for body, why in cases:
        with pytest.raises(flowkit.DefinitionError) as info:
            declare(body)
        message = str(info.value)
        assert (
            message.startswith(f"agent {body.__name__!r}: stream.through(") and "\n" not in message
        )
        assert why in message
    dst = app.topic("dst", value_type=int)
    assert dst.name == "dst" and app.agents == []


def test_one_hop_per_chain_and_only_filter_or_map_before_it() -> None:
    from flowkit.streams.hops import Hop, split

    through = ("hop", Hop("through", "t"))
    with pytest.raises(flowkit.DefinitionError, match="only filter\\(\\) and map\\(\\)"):
        split((("events", None), through))
    with pytest.raises(flowkit.DefinitionError, match="hops once"):
        split((through, ("hop", Hop("group_by", "g", len))))
    with pytest.raises(flowkit.DefinitionError, match="echo\\(\\) cannot come after through"):
        split((through, ("echo", None)))
    hop, before, after = split((("map", str), through, ("events", None)))
    assert hop.name == "t" and len(before) == len(after) == 1


# -- the graph and the CLI ---------------------------------------------------------------


def test_the_graph_shows_the_hop_and_check_knows_the_table_is_written_after_it() -> None:
    app, *_ = make_app()
    graph = app.graph()
    edges = {(e.source, e.target, e.kind) for e in graph.edges}
    assert ("agent:hop", "topic:readings", "forwards") in edges
    assert ("topic:readings", "agent:hop", "reads") in edges
    assert ("topic:raw", "agent:hop", "reads") in edges
    # raw has 1 partition and the table 4: fine, the table is written after the hop.
    assert graph.check() == []

    other = flowkit.App("thru2", partitions=4)
    raw2 = other.topic("raw", value_type=Raw, partitions=1)
    narrow = other.topic("narrow", value_type=Raw, partitions=2)
    table = other.table("last")

    @other.agent(raw2)
    async def hop(stream: flowkit.Stream[Raw]) -> None:
        async for r in stream.through(narrow):
            table[r.sensor] = r.tenths

    assert other.graph().check() == [
        "agent 'hop' reads 'narrow' (2 partitions) and uses table 'last' (4 partitions): "
        "they must be co-partitioned (same partition count)"
    ]


def test_flowkit_graph_prints_the_example_hop() -> None:
    runner = CliRunner()
    graph = runner.invoke(cli, ["graph", "examples.through:app"])
    assert graph.exit_code == 0
    assert "reads raw-readings\n" in graph.output
    assert "reads readings\n" in graph.output and "forwards readings\n" in graph.output
    check = runner.invoke(cli, ["graph", "examples.through:app", "--check"])
    assert (check.exit_code, check.output) == (0, "ok: 4 topics, 1 agent, 1 table\n")


async def test_the_example_prints_exactly_this(capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.reload(importlib.import_module("examples.through"))
    await module.main()
    assert capsys.readouterr().out == (
        "highest: {'boiler': 60.0, 'garage': 5.0, 'kitchen': 20.0, 'sauna': 90.0}\n"
        "readings/0: garage 5.0 high, garage 4.0\n"
        "readings/1: boiler 60.0 high\n"
        "readings/2: sauna 80.0 high, sauna 90.0 high\n"
        "readings/3: kitchen 20.0 high\n"
    )
