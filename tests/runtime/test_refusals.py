"""Records the producer or the broker refuses for good: the worker goes on.

A dead letter always fits (its value is cut, and headers say so); an output refused as too
large fails only its own record (dead-lettered, stage ``output``); a dead letter refused
even without its value is logged and counted, and the worker moves on. The same tests run
on the Kafka test broker, where the producer's ``max_request_size`` is the limit; a broker
that refuses a record only when it acks it is played by a memory transport below.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

import pytest

import flowkit
from flowkit.deadletter import DeadLetter
from flowkit.errors import RecordRejected
from flowkit.records import Headers, Message, RawMessages, TopicPartition, record_size
from flowkit.testing import TestDriver
from flowkit.transports import Ack, MemoryBroker, MemoryTransport, OutRecord, Transport
from flowkit.transports.base import OffsetReset, TopicSpec
from flowkit.transports.memory.clients import MemoryConsumer, MemoryProducer
from tests.apache_kafka import ApacheKafka
from tests.conftest import APACHE_KAFKA, KAFKA_TEST_SETTINGS, DriverFactory

LIMIT = 100_000  # bytes of key, value and headers the producer sends (about, on Kafka)


class Order(flowkit.Record):
    n: int
    blow_up: int = 0  # the agent's output carries this many bytes


class Out(flowkit.Record):
    n: int
    pad: str = ""


def _app() -> tuple[flowkit.App, flowkit.Topic[Order], flowkit.Topic[Out]]:
    name = f"refusals-{uuid.uuid4().hex[:8]}"  # fresh topics and group on a shared broker
    app = flowkit.App(name)
    orders = app.topic(f"{name}-orders", value_type=Order, partitions=1)
    out = app.topic(f"{name}-out", value_type=Out, partitions=1)

    @app.agent(orders, sink=out)
    async def relay(stream: flowkit.Stream[Order]) -> AsyncIterator[Out]:
        async for order in stream:
            yield Out(order.n, "x" * order.blow_up)

    return app, orders, out


Make = Callable[[flowkit.App], TestDriver]


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """A driver whose producers refuse records over about ``LIMIT`` bytes."""
    transports: list[Transport] = []

    def build(app: flowkit.App) -> TestDriver:
        if request.param == "memory":
            return TestDriver(app, transport=MemoryTransport(max_record_bytes=LIMIT))
        from flowkit.transports.kafka import KafkaTransport
        from flowkit.transports.kafka.producer import KAFKA_FRAMING

        address = request.getfixturevalue("kafka_bootstrap")
        transport = KafkaTransport(
            [address], **KAFKA_TEST_SETTINGS, max_request_size=LIMIT + KAFKA_FRAMING
        )
        transports.append(transport)
        return TestDriver(app, transport=transport, settle=0.3)

    yield build
    for transport in transports:
        await transport.aclose()


async def test_a_record_too_large_to_dead_letter_whole_is_cut_and_the_worker_goes_on(
    make: Make,
) -> None:
    app, orders, out = _app()
    just_under = b"{" + b"x" * (LIMIT - 200)  # fits alone; not with the dead-letter headers
    small_bad = b"{" + b"y" * 5_000
    async with make(app) as driver:
        for n in range(5):
            await driver.send(orders, Order(n), key=f"k{n}")
        await driver.send_raw(orders, just_under, key=b"big")
        await driver.send(orders, Order(5, blow_up=LIMIT + 2_000), key="k5")  # output too large
        await driver.send_raw(orders, small_bad, key=b"small")
        for n in range(6, 10):
            await driver.send(orders, Order(n), key=f"k{n}")
        await driver.run_until_idle()
        outputs = await driver.values(out)
        letters = [DeadLetter(m) for m in await driver.dead_letters()]
        metrics = driver.worker.metrics
    assert [o.n for o in outputs] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert all(o.pad == "" for o in outputs)
    by_key = {letter.message.key: letter for letter in letters}
    assert sorted(by_key) == [b"big", b"k5", b"small"]

    cut = by_key[b"big"]
    assert cut.truncated and cut.stage == "decode"
    assert cut.original_size == len(just_under)
    assert cut.value_sha256 == hashlib.sha256(just_under).hexdigest()
    assert cut.message.value is not None and just_under.startswith(cut.message.value)
    assert 0 < len(cut.message.value) < len(just_under)
    assert record_size(cut.message.key, cut.message.value, cut.message.headers) <= LIMIT
    assert (cut.source_topic, cut.source_partition, cut.source_offset) == (orders.name, 0, 5)

    refused = by_key[b"k5"]
    assert refused.stage == "output" and refused.error_type == "RecordRejected"
    assert not refused.truncated and refused.source_offset == 6
    assert orders.decode(refused.message.value or b"") == Order(5, blow_up=LIMIT + 2_000)

    whole = by_key[b"small"]
    assert not whole.truncated and whole.message.value == small_bad
    assert metrics.dead_letters.labels("decode")._value.get() == 2
    assert metrics.dead_letters.labels("output")._value.get() == 1
    assert metrics.dead_letters_lost.labels("decode")._value.get() == 0


async def test_a_dead_letter_refused_even_without_its_value_is_counted_and_skipped() -> None:
    app, orders, out = _app()
    transport = MemoryTransport(max_record_bytes=LIMIT)
    async with TestDriver(app, transport=transport) as driver:
        await driver.send(orders, Order(0), key="k0")
        # A key so large that the dead letter's headers push it over even with no value.
        await driver.send_raw(orders, b"{", key=b"k" * (LIMIT - 10))
        await driver.send(orders, Order(1), key="k1")
        await driver.run_until_idle()
        assert [o.n for o in await driver.values(out)] == [0, 1]
        assert await driver.dead_letters() == []
        assert driver.worker.metrics.dead_letters_lost.labels("decode")._value.get() == 1
        assert driver.worker.tracker.committable() != {}  # the record is done, not stuck
    await transport.aclose()


# -- a broker that refuses a record only when it answers --------------------------------


class _LateRefusingProducer(MemoryProducer):
    """Takes every record at once, like Kafka's producer under its own limit; the
    "broker" then refuses those over ``refuse_over`` bytes in the ack (a batch with one
    of them in it: whole)."""

    def __init__(self, broker: MemoryBroker, refuse_over: int, skip_topic: str) -> None:
        super().__init__(broker)
        self.refuse_over = refuse_over
        self.skip_topic = skip_topic  # the test's own input: never refused

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Ack]:
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        if topic != self.skip_topic and record_size(key, value, headers) > self.refuse_over:
            future.set_exception(RecordRejected("MessageSizeTooLargeError: over the limit"))
        else:
            ack = await super().send(
                topic,
                value,
                key=key,
                headers=headers,
                partition=partition,
                timestamp_ms=timestamp_ms,
            )
            future.set_result(await ack)
        return future

    async def send_batch(
        self, topic: str, partition: int, records: Sequence[OutRecord]
    ) -> list[tuple[int, Awaitable[Ack]]]:
        # One broker batch: refused whole if any record in it is over the limit.
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        sizes = [record_size(key, value, headers) for key, value, headers, _ in records]
        if topic != self.skip_topic and max(sizes) > self.refuse_over:
            future.set_exception(RecordRejected("MessageSizeTooLargeError: over the limit"))
        else:
            [(_, ack)] = await super().send_batch(topic, partition, records)
            future.set_result(await ack)
        return [(len(records), future)]


class _RawConsumer(MemoryConsumer):
    """Returns its records as a client's own (here: 1-tuples around each Message) in
    ``RawMessages``, as the librdkafka transport does."""

    async def getmany(
        self, timeout: float, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Message]]:
        fetched = await super().getmany(timeout, max_records)
        return {
            tp: RawMessages([(m,) for m in ms], _value, _first, _key) for tp, ms in fetched.items()
        }


def _value(r: tuple[Message]) -> bytes | None:
    return r[0].value


def _first(r: tuple[Message]) -> Message:
    return r[0]


def _key(r: tuple[Message]) -> bytes | None:
    return r[0].key


class _LateRefusingTransport(MemoryTransport):
    def __init__(self, refuse_over: int, skip_topic: str, raw: bool) -> None:
        super().__init__()
        self.refuse_over, self.skip_topic, self.raw = refuse_over, skip_topic, raw

    def producer(self, *, client_id: str = "flowkit") -> MemoryProducer:
        producer = _LateRefusingProducer(self.broker, self.refuse_over, self.skip_topic)
        self._clients.append(producer)
        return producer

    def consumer(
        self,
        *,
        group_id: str | None,
        client_id: str = "flowkit",
        auto_offset_reset: OffsetReset = "earliest",
    ) -> MemoryConsumer:
        if not self.raw:
            return super().consumer(
                group_id=group_id, client_id=client_id, auto_offset_reset=auto_offset_reset
            )
        consumer = _RawConsumer(
            self.broker,
            group_id=group_id,
            client_id=client_id,
            auto_offset_reset=auto_offset_reset,
        )
        self._clients.append(consumer)
        return consumer


# raw: the records reach the agent as a client's own (librdkafka's RawMessages), whose
# outputs carry their record unconverted until a send is refused.
@pytest.mark.parametrize("raw", [False, True])
async def test_refusals_in_the_ack_fail_their_record_and_resend_the_dead_letter_bare(
    raw: bool,
) -> None:
    app, orders, out = _app()
    big_bad = b"{" + b"z" * 20_000
    transport = _LateRefusingTransport(refuse_over=10_000, skip_topic=orders.name, raw=raw)
    async with TestDriver(app, transport=transport) as driver:
        await driver.send(orders, Order(0), key="k0")
        await driver.send(orders, Order(1, blow_up=15_000), key="k1")  # output refused later
        await driver.send_raw(orders, big_bad, key=b"bad")  # its dead letter refused later
        await driver.send(orders, Order(2), key="k2")
        # A refusal in an ack is found by the next checkpoint (the worker is not idle
        # until then), so checkpoint until both dead letters are there.
        for _ in range(1000):
            await driver.worker.checkpoint()
            if len(await driver.dead_letters()) == 2:
                break
            await asyncio.sleep(0.01)
        await driver.run_until_idle()
        outputs = [o.n for o in await driver.values(out)]
        letters = {m.key: DeadLetter(m) for m in await driver.dead_letters()}
        metrics = driver.worker.metrics
    await transport.aclose()
    assert outputs == [0, 2]
    assert sorted(letters) == [b"bad", b"k1"]
    assert letters[b"k1"].stage == "output" and letters[b"k1"].source_offset == 1
    bare = letters[b"bad"]
    assert bare.message.value is None and bare.truncated
    assert bare.original_size == len(big_bad)
    assert bare.value_sha256 == hashlib.sha256(big_bad).hexdigest()
    assert metrics.errors.labels(app.agents[0].name, "output")._value.get() == 1
    assert metrics.dead_letters_lost.labels("decode")._value.get() == 0


class Stamped(flowkit.Record):
    n: int
    at_ms: int  # the output's timestamp, from the record: a producer's data


# One client per test by default; FLOWKIT_TEST_ALL_CLIENTS=1: both.
ALL = os.environ.get("FLOWKIT_TEST_ALL_CLIENTS", "") not in ("", "0")


@pytest.mark.kafka
@pytest.mark.apache_kafka
@pytest.mark.parametrize("client", ["aiokafka", "rdkafka"] if ALL else ["rdkafka"])
async def test_a_batch_the_broker_refuses_in_its_ack_fails_only_its_culprits(
    clean_apache_kafka: ApacheKafka, client: str
) -> None:
    """A topic's ``max.message.bytes`` below the producer's limit: the broker refuses, in
    its ack, the whole batch that holds a record too large for it. Only those records
    fail (dead-lettered, stage ``output``): the others are sent again apart, and written;
    the agent is never started again."""
    from flowkit.transports import transport_from_url

    app, orders, out = _app()
    transport = transport_from_url(clean_apache_kafka.url, client=client, **KAFKA_TEST_SETTINGS)
    small = {"max.message.bytes": "8192"}  # the producer's own limit is about 1 MB
    await transport.create_topics([TopicSpec(out.name, 1, config=small)])
    big = (3, 11)
    async with TestDriver(app, transport=transport, settle=0.3) as driver:
        for n in range(20):
            await driver.send(orders, Order(n, blow_up=20_000 if n in big else 0), key=f"k{n}")
        # A refusal in an ack is found by the next checkpoint (see above).
        deadline = time.monotonic() + 60
        while len(await driver.dead_letters()) < len(big) and time.monotonic() < deadline:
            await driver.worker.checkpoint()
            await asyncio.sleep(0.05)
        await driver.run_until_idle(timeout=60)
        outputs = await driver.values(out)
        letters = [DeadLetter(m) for m in await driver.dead_letters()]
    await transport.aclose()
    assert sorted(o.n for o in outputs) == [n for n in range(20) if n not in big]
    assert sorted((letter.stage, letter.source_offset) for letter in letters) == [
        ("output", n) for n in big
    ]
    assert all(letter.error_type == "RecordRejected" for letter in letters)


@pytest.mark.parametrize("make_driver", APACHE_KAFKA if ALL else APACHE_KAFKA[:1], indirect=True)
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_send_stamped_beyond_its_topic_fails_alone_when_sent(
    make_driver: DriverFactory, guarantee: str
) -> None:
    """Apache Kafka refuses a record stamped over an hour ahead, and with it the rest of
    its broker batch, and in a transaction the whole transaction. ``topic.send()`` with
    such a ``timestamp_ms=`` fails at once, in the agent, against the topic's own bounds:
    only its record is dead-lettered, the others are written once, and under exactly-once
    no transaction is aborted."""
    name = f"stamps-{uuid.uuid4().hex[:8]}"
    app = flowkit.App(name, processing_guarantee=guarantee)  # type: ignore[arg-type]
    orders = app.topic(f"{name}-orders", value_type=Stamped, partitions=1)
    out = app.topic(f"{name}-out", value_type=Out, partitions=1)
    starts = 0

    @app.agent(orders)
    async def stamp(stream: flowkit.Stream[Stamped]) -> None:
        nonlocal starts
        starts += 1
        async for order in stream:
            await out.send(Out(order.n), key=b"same", timestamp_ms=order.at_ms)

    now = int(time.time() * 1000)
    ahead = now + 10 * 24 * 3600 * 1000  # ten days: over the broker's hour
    stamps = [ahead if n in (3, 11) else now + n for n in range(20)]
    async with make_driver(app) as driver:
        for n, at in enumerate(stamps):
            await driver.send(orders, Stamped(n, at), key="k", timestamp_ms=now)
        await driver.run_until_idle(timeout=60)
        await driver.worker.checkpoint()  # under exactly-once: the transaction commits
        await driver.run_until_idle(timeout=60)
        outputs = await driver.values(out)
        letters = [DeadLetter(m) for m in await driver.dead_letters()]
    assert sorted(o.n for o in outputs) == [n for n in range(20) if n not in (3, 11)]
    assert sorted((letter.stage, letter.source_offset) for letter in letters) == [
        ("output", 3),
        ("output", 11),
    ]
    assert all(letter.error_type == "RecordRejected" for letter in letters)
    assert starts == 3  # raised in its body: started again, as for any exception there


class Purchase(flowkit.Record):
    customer: str


LONG_MAX = str(2**63 - 1)


@pytest.mark.kafka
@pytest.mark.apache_kafka
async def test_a_timestamp_the_input_took_is_taken_by_every_topic_flowkit_makes(
    clean_apache_kafka: ApacheKafka,
) -> None:
    """A topic may hold records stamped far ahead (written before Apache Kafka 4.0, whose
    brokers refuse a record over an hour ahead, or to a topic configured to allow them).
    flowkit carries a record's timestamp into the topics it makes (a group_by's
    repartition topic, the dead-letter topic): they take whatever timestamp the input
    took, so such a record is processed, or dead-lettered, like any other, and never stops
    the worker."""
    from flowkit.transports import transport_from_url

    name = f"ahead-{uuid.uuid4().hex[:8]}"
    app = flowkit.App(name)
    purchases = app.topic(f"{name}-purchases", value_type=Purchase, partitions=1)
    counts = app.table("counts", default=int)

    @app.agent(purchases)
    async def count(stream: flowkit.Stream[Purchase]) -> None:
        async for purchase in stream.group_by(lambda p: p.customer, name="by-customer"):
            counts[purchase.customer] += 1

    now = int(time.time() * 1000)
    ahead = now + 10 * 24 * 3600 * 1000
    transport = transport_from_url(clean_apache_kafka.url, **KAFKA_TEST_SETTINGS)
    allow = {"message.timestamp.after.max.ms": LONG_MAX}  # as a topic of Kafka 3 took them
    await transport.create_topics([TopicSpec(purchases.name, 1, config=allow)])
    async with TestDriver(app, transport=transport, settle=0.3) as driver:
        for n, at in enumerate([now, ahead, now, ahead]):
            await driver.send(purchases, Purchase(f"c{n % 2}"), key=f"k{n}", timestamp_ms=at)
        await driver.send_raw(purchases, b"not json", key=b"bad", timestamp_ms=ahead)
        await driver.run_until_idle(timeout=60)
        assert {c: counts[c] for c in ("c0", "c1")} == {"c0": 2, "c1": 2}
        letters = [DeadLetter(m) for m in await driver.dead_letters()]
    await transport.aclose()
    assert [(letter.message.key, letter.stage) for letter in letters] == [(b"bad", "decode")]
