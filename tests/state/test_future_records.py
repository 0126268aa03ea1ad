"""Far-future records: one record stamped in 2100 must not move stream time (it would close
every window at once and make every later record late). In a stream-stream join, on the
memory broker and Kafka; a keyless one neither; nor a stream time restored from a
changelog that an older version wrote. The same guard in windowed tables: their stored
watermarks, and the markers of their internal topic."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import flowkit
from examples import payments
from flowkit.state.joins.store import TIME_KEY
from flowkit.state.windowed import wire
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from tests.conftest import DriverFactory

T0 = 1_700_000_000_000  # the fake clock's start
FAR = 4_102_444_800_000  # 2100-01-01 00:00 UTC


def error_types(dead: list[Any]) -> list[bytes]:
    return [dict(d.headers)["flowkit.error.type"] for d in dead]


def with_far_future(sample: list[payments.Sample], at: int, record: payments.Sample) -> list[Any]:
    return [*sample[:at], record, *sample[at:]]


async def send(driver: TestDriver, records: list[Any]) -> None:
    for topic, key, value, ts in records:
        await driver.send(topic, value, key=key, timestamp_ms=ts)
    await driver.run_until_idle(timeout=60)


def paid_order_ids(sample: list[payments.Sample]) -> set[str]:
    return {value.order_id for topic, _, value, _ in sample if topic == "payments"}


async def test_a_payment_stamped_in_2100_leaves_later_orders_paid(
    make_driver: DriverFactory,
) -> None:
    """The user's report: after one payment stamped in 2100, every later record was late
    and the orders paid after it came out unpaid."""
    sample = payments.sample(1_200, start_ms=T0)
    bogus = payments.Payment(sample[600][1], 1, "card")  # for a real order, far ahead
    records = with_far_future(sample, 600, ("payments", sample[600][1], bogus, FAR))
    async with make_driver(payments.make_app(generate=False)) as driver:
        await send(driver, records)
        paid = await driver.values("paid-orders")
        unpaid = await driver.values("unpaid-orders")
        dead = await driver.dead_letters()
    assert {p.id for p in paid} == paid_order_ids(sample)
    assert len(paid) == len(paid_order_ids(sample))  # each once, with its own payment
    assert not {u.id for u in unpaid} & paid_order_ids(sample)
    assert error_types(dead) == [b"FutureRecord"]
    assert msgspec.json.decode(dead[0].value) == msgspec.to_builtins(bogus)


async def test_a_keyless_record_stamped_in_2100_moves_no_stream_time() -> None:
    """A record without a key joins nothing, but its time counts: not a time in 2100."""
    sample = payments.sample(600, start_ms=T0)
    keyless = ("orders", None, payments.Order("nobody", "c0", 1), FAR)
    async with TestDriver(payments.make_app(generate=False)) as driver:
        # On every partition: a keyless record goes to any of them.
        for p in range(payments.PARTITIONS):
            await driver.send("orders", keyless[2], key=None, partition=p, timestamp_ms=FAR)
        await send(driver, sample)
        paid = await driver.values("paid-orders")
        dead = await driver.dead_letters()
    assert {p.id for p in paid} == paid_order_ids(sample)
    assert error_types(dead) == [b"FutureRecord"] * payments.PARTITIONS


async def test_a_join_takes_max_future_as_windows_do() -> None:
    """``max_future=`` moves the limit: two hours ahead is fine with three hours."""
    sample = payments.sample(300, start_ms=T0)
    ahead = T0 + 2 * 3600_000
    late_order = ("orders", "ahead", payments.Order("ahead", "c0", 1), ahead)

    def app(max_future: float) -> flowkit.App:
        app = flowkit.App("mf", partitions=1)
        orders = app.topic("orders", value_type=payments.Order)
        pays = app.topic("payments", value_type=payments.Payment)
        out = app.topic("out", value_type=str)
        join = app.join(orders, pays, within=60, how="left", name="j", max_future=max_future)

        @app.agent(join, sink=[out])
        async def emit(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[str]:
            async for j in stream:
                yield j.left.id

        return app

    for max_future, dead_letters in ((3600.0, [b"FutureRecord"]), (3 * 3600.0, [])):
        async with TestDriver(app(max_future)) as driver:
            await send(driver, [*sample, late_order])
            assert error_types(await driver.dead_letters()) == dead_letters


@pytest.mark.parametrize("max_future", [0, -1.0, "1h", True])
def test_max_future_must_be_positive_seconds(max_future: Any) -> None:
    app = flowkit.App("bad")
    a = app.topic("a", value_type=payments.Order)
    with pytest.raises(flowkit.DefinitionError, match="max_future"):
        app.join(a, a, within=1.0, name="x", max_future=max_future)
    with pytest.raises(flowkit.DefinitionError, match="max_future"):
        flowkit.TumblingWindow(10.0, max_future=max_future)


async def test_a_stream_time_in_2100_from_the_changelog_is_not_trusted() -> None:
    """An older version let a 2100 record move stream time and wrote it to the changelog:
    a restart does not take it back (one log line says so), and the join goes on."""
    broker = MemoryBroker()
    first, second = (
        payments.sample(400, start_ms=T0),
        payments.sample(400, start_ms=T0 + 60_000, seed=8, prefix="n"),
    )
    async with TestDriver(payments.make_app(generate=False), broker=broker) as driver:
        await send(driver, first)
    # What an older version wrote for every partition: stream time in 2100.
    producer = MemoryTransport(broker).producer()
    for p in range(payments.PARTITIONS):
        state = msgspec.json.encode((FAR, -1, -1))
        await producer.send("payments-settled-changelog", state, key=TIME_KEY, partition=p)
    with capture_logs() as logs:
        async with TestDriver(payments.make_app(generate=False), broker=broker) as driver:
            await send(driver, second)
            paid = await driver.values("paid-orders")
            dead = await driver.dead_letters()
    assert {p.id for p in paid} == paid_order_ids(first) | paid_order_ids(second)
    assert dead == []
    distrusted = warnings_about(logs, "stream time in the changelog")
    assert len(distrusted) == payments.PARTITIONS  # one line per partition


# -- windowed tables: the same guard -----------------------------------------------------


class Click(flowkit.Record):
    campaign: str
    t: int


def window_app(closed: list[tuple[str, int, int]]) -> flowkit.App:
    app = flowkit.App("win", partitions=2)
    clicks = app.topic("clicks", value_type=Click)
    counts = app.table("counts", default=int).tumbling(
        10.0,
        grace=2.0,
        time=lambda c: c.t,
        on_close=lambda key, window, value: closed.append((key, window.start, value)),
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            counts[click.campaign] += 1

    return app


def warnings_about(logs: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    return [e for e in logs if what in e["event"] and e["log_level"] == "warning"]


async def test_a_windowed_table_does_not_trust_a_stored_watermark_in_2100() -> None:
    """Both stages' stored watermarks in 2100 (an older version's, or a wrong clock's):
    without the guard every later record is late (stage 1) and every partial a replay
    (stage 2)."""
    broker, clock, closed = MemoryBroker(), FakeClock(), []
    t0 = T0 - 600_000
    async with TestDriver(window_app(closed), broker=broker, clock=clock) as driver:
        for i in range(10):
            await driver.send("clicks", Click("c", t0 + i * 1000), partition=i % 2)
        await driver.run_until_idle()
    producer = MemoryTransport(broker).producer()
    for p in range(2):
        state = wire.encode((FAR - 2000, FAR, FAR - 2000))
        await producer.send("win-counts-changelog", state, key=wire.WATERMARK_KEY, partition=p)
        for source in range(2):
            key = wire.source_key(source)
            await producer.send("win-counts-changelog", wire.encode(FAR), key=key, partition=p)
    with capture_logs() as logs:
        async with TestDriver(window_app(closed), broker=broker, clock=clock) as driver:
            for i in range(10, 30):
                await driver.send("clicks", Click("c", t0 + i * 1000), partition=i % 2)
            await driver.run_until_idle()
            assert await driver.dead_letters() == []
            await driver.advance(70)  # the data ends: idle partitions close the rest
    assert sorted(closed) == [("c", t0, 10), ("c", t0 + 10_000, 10), ("c", t0 + 20_000, 10)]
    # One line per stored watermark: stage 1 of each partition, stage 2 of each source.
    assert len(warnings_about(logs, "stream time in the changelog")) == 2 + 2 * 2


async def test_a_marker_in_2100_on_the_repartition_topic_is_ignored() -> None:
    """Anyone with produce rights can write the internal topic: a forged watermark of
    source 0 would let the owner close windows without that source's partials."""
    closed: list[tuple[str, int, int]] = []
    t0 = T0 - 600_000
    with capture_logs() as logs:
        async with TestDriver(window_app(closed)) as driver:
            for q in range(2):
                await driver.send_raw("win-counts-repartition", wire.marker(FAR, 0), partition=q)
            await driver.send("clicks", Click("c", t0 + 1000), partition=0)
            await driver.send("clicks", Click("c", t0 + 1000), partition=1)
            await driver.send("clicks", Click("c", t0 + 15_000), partition=1)  # 1 passes W0
            await driver.run_until_idle()
            assert closed == []  # source 0 has not passed the first window's end
            await driver.advance(70)
    assert sorted(closed) == [("c", t0, 2), ("c", t0 + 10_000, 1)]
    assert warnings_about(logs, "markers beyond max_future")


# -- the property: far-future records change nothing but the dead letters -----------------


class Ev(flowkit.Record):
    id: str


def join_app(how: str) -> flowkit.App:
    app = flowkit.App("prop", partitions=2)
    left = app.topic("left", value_type=Ev)
    right = app.topic("right", value_type=Ev)
    out = app.topic("out", value_type=str)
    join = app.join(left, right, within=2.0, grace=1.0, how=how, name="j")

    @app.agent(join, sink=[out])
    async def emit(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[str]:
        async for j in stream:
            yield f"{j.key}:{j.left.id if j.left else '-'}:{j.right.id if j.right else '-'}"

    return app


Rec = tuple[str, str | None, int | None, str, int]  # (topic, key, partition, id, timestamp)


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[Rec], list[Rec]]:
    """Valid records (out of order by less than the grace, so none is late) in arrival
    order, and the same with far-future records put in anywhere: keyed or not, on either
    topic, just past the guard or in 2100."""
    valid: list[Rec] = []
    for n in range(draw(st.integers(1, 40))):
        topic = draw(st.sampled_from(["left", "right"]))
        ts = T0 + n * 400 + draw(st.integers(0, 900))
        valid.append((topic, f"k{draw(st.integers(0, 3))}", None, f"{topic[0]}{n}", ts))
    mixed = list(valid)
    for n in range(draw(st.integers(1, 6))):
        topic = draw(st.sampled_from(["left", "right"]))
        key = draw(st.sampled_from(["k0", "k1", None]))
        partition = draw(st.integers(0, 1)) if key is None else None
        ts = draw(st.sampled_from([T0 + 3_600_001, T0 + 3_600_000 + 10**9, FAR]))
        at = draw(st.integers(0, len(mixed)))
        mixed.insert(at, (topic, key, partition, f"future{n}", ts))
    return valid, mixed


async def run_join(how: str, records: list[Rec], fetch: int) -> tuple[list[str], list[Any]]:
    """Records produced first (a backlog, so the join merges its topics by timestamp),
    then read by a worker in batches of ``fetch``: the join's results and dead letters."""
    broker = MemoryBroker()
    for name in ("left", "right"):
        broker.create_topic(name, 2)
    producer = MemoryTransport(broker).producer()
    for topic, key, partition, ident, ts in records:
        await producer.send(
            topic,
            msgspec.json.encode(Ev(ident)),
            key=None if key is None else key.encode(),
            partition=partition,
            timestamp_ms=ts,
        )
    options = {"max_fetch_records": fetch, "queue_batches": 1}
    async with TestDriver(join_app(how), broker=broker, **options) as driver:
        await driver.run_until_idle(timeout=30)
        return sorted(await driver.values("out")), await driver.dead_letters()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=interleavings(),
    how=st.sampled_from(["inner", "left", "outer"]),
    fetch=st.sampled_from([1, 3, 500]),
)
def test_far_future_records_change_nothing_but_the_dead_letters(
    data: tuple[list[Rec], list[Rec]], how: str, fetch: int
) -> None:
    valid, mixed = data
    expected, none = asyncio.run(run_join(how, valid, fetch))
    got, dead = asyncio.run(run_join(how, mixed, fetch))
    assert none == []
    assert got == expected
    futures = sorted(r[3] for r in mixed if r[3].startswith("future"))
    assert sorted(msgspec.json.decode(d.value, type=Ev).id for d in dead) == futures
    assert set(error_types(dead)) == {b"FutureRecord"}
