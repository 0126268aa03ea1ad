"""Sliding windows: Kafka Streams' ``SlidingWindows`` semantics, checked against a
plain-Python reference on random streams (with a restart midway), and for bounded state."""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.runtime.web.status import status
from flowkit.state.windowed.sliding_disk_store import DiskSlidingStore
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from tests.conftest import ALL_CLIENTS, DriverFactory, WindowStores

# The suites run on both stores (``window_store``, tests/conftest.py): each Hypothesis
# example gets its own local state with ``window_store.fresh()``.

SIZE, SECOND = 10_000, 1000
Result = tuple[str, int, int, Any]  # key, start, end, value
Update = tuple[str, int, int, Any, bool]  # key, start, end, value, final


class Hit(flowkit.Record):
    user: str
    t: int  # event time, ms
    n: int = 1


def reference(
    records: Iterable[tuple[str, int, Any]],
    size: int,
    grace: int,
    states: list[dict[tuple[str, int, int], Any]] | None = None,
) -> tuple[list[Result], list[tuple[str, int]]]:
    """Kafka Streams' sliding-window aggregation over one partition, in plain Python and
    by brute force: the windows emitted when they close, and the late records; ``states``
    gets the open windows with their values after each record.

    Windows are ``[start, start + size]``, both ends included: one ending at each record,
    and one starting just after each record that a later record follows within
    ``size + 1``. On each record, stream time moves and close time is stream time minus
    grace; a record is late when ``ts + size`` is before close time. Otherwise every
    window its key's records define that ends at or after close time is created (with
    the records inside) or updated (with this record); then the windows that end before
    close time are emitted, each once. A window's value is its records' values in time
    order (arrival order within one time)."""
    stream_time = -(2**62)
    open_: dict[tuple[str, int], list[tuple[int, int, Any]]] = {}
    done: set[tuple[str, int]] = set()
    seen: dict[str, list[tuple[int, int, Any]]] = {}
    closed: list[Result] = []
    late: list[tuple[str, int]] = []
    for i, (key, ts, value) in enumerate(records):
        stream_time = max(stream_time, ts)
        close = stream_time - grace
        if ts + size < close:
            late.append((key, ts))
            if states is not None:
                states.append(states[-1] if states else {})
            continue
        record = (ts, i, value)
        mine = seen.setdefault(key, [])
        mine.append(record)
        times = sorted({t for t, _, _ in mine})
        starts = {t - size for t in times}
        starts |= {t + 1 for t in times if any(t < u <= t + 1 + size for u in times)}
        for start in starts:
            end = start + size
            if end < close or (key, start) in done:
                continue
            members = open_.get((key, start))
            if members is None:
                open_[(key, start)] = [r for r in mine if start <= r[0] <= end]
            elif start <= ts <= end:
                members.append(record)
        for (k, start), members in sorted(open_.items(), key=lambda kv: kv[0][1]):
            if start + size < close:
                del open_[(k, start)]
                done.add((k, start))
                closed.append((k, start, start + size, fold(members)))
        if states is not None:
            states.append({(k, s, s + size): fold(m) for (k, s), m in open_.items()})
    return sorted(closed), sorted(late)


def fold(members: list[tuple[int, int, Any]]) -> Any:
    total: Any = None
    for _, _, v in sorted(members):
        total = v if total is None else total + v
    return total


def sliding_app(
    closed: list[Result],
    late: list[tuple[str, int]],
    *,
    grace: float,
    partitions: int = 1,
    size: int = SIZE,
    updates: list[Update] | None = None,
) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("sliding", partitions=partitions)
    hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)

    def on_close(key: str, window: flowkit.Window, value: Any) -> None:
        closed.append((key, window.start, window.end, value))

    def on_late(key: str, window: flowkit.Window, value: Any) -> None:
        late.append((key, window.end))

    recent = app.table("recent", default=list).sliding(
        size / 1000,
        grace=grace,
        combine=operator.add,
        time=lambda h: h.t,
        on_close=on_close,
        late=on_late,
        emit_on="close" if updates is None else "update",
        on_update=(
            None
            if updates is None
            else lambda key, w, value, final: updates.append((key, w.start, w.end, value, final))
        ),
    )

    @app.agent(hits)
    async def collect(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            recent.add(hit.user, [hit.n])

    return app, hits, recent


def base_ms(clock: FakeClock) -> int:
    return int(clock.time() * 1000) - 3_600_000


# Offsets in ms from a base time: mostly a busy half minute in half seconds, some 1 ms
# off (windows meet or miss at their ends: 10 s apart, 10 s + 1 ms), some far ahead
# (late records follow them).
near = st.builds(lambda h, j: h * 500 + j, st.integers(0, 60), st.sampled_from([0, 0, 1, -1]))
offsets = st.one_of(near, near, near, st.integers(80, 180).map(lambda h: h * 500))
streams = st.lists(st.tuples(st.sampled_from("ab"), offsets), min_size=1, max_size=25)


# More with FLOWKIT_SLIDING_EXAMPLES=500 (a fuzz run, not for CI).
@settings(
    max_examples=int(os.environ.get("FLOWKIT_SLIDING_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    stream=streams,
    grace=st.sampled_from([0, 4, 30]),
    cut=st.floats(0, 1),
    emit_on=st.sampled_from(["close", "update"]),
    flush_every=st.sampled_from([1, 4, 100]),
)
async def test_every_window_emitted_matches_the_reference(
    window_store: WindowStores,
    stream: list[tuple[str, int]],
    grace: int,
    cut: float,
    emit_on: str,
    flush_every: int,
) -> None:
    window_store.fresh()  # each example's own local state
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    records = [(user, t0 + ms, [i]) for i, (user, ms) in enumerate(stream)]
    records.append(("end", t0 + 2000 * SECOND, [-1]))  # every other key's windows close
    states: list[dict[tuple[str, int, int], Any]] = []
    expected, expected_late = reference(records, SIZE, grace * SECOND, states)
    closed: list[Result] = []
    late: list[tuple[str, int]] = []
    updates: list[Update] | None = [] if emit_on == "update" else None
    # A worker stops (cleanly) midway and another goes on from the changelog.
    split = int(cut * len(records))
    for part in (records[:split], records[split:]):
        app, hits, _ = sliding_app(closed, late, grace=grace, updates=updates)
        async with TestDriver(app, broker=broker, clock=clock, fail_fast=True) as driver:
            for i, (user, ts, value) in enumerate(part):
                await driver.send(hits, Hit(user, ts, value[0]), key=user)
                if i % flush_every == flush_every - 1:
                    await driver.run_until_idle()
            await driver.run_until_idle()
    assert sorted(closed) == expected, (closed, expected)
    assert sorted(late) == expected_late
    if updates is not None:
        assert sorted(u[:4] for u in updates if u[4]) == expected  # each final once
        check_updates([u for u in updates if not u[4]], states, exact=flush_every == 1)


def check_updates(
    updates: list[Update], states: list[dict[tuple[str, int, int], Any]], exact: bool
) -> None:
    """Every running update is a window as it stood after some prefix of the stream, the
    prefixes in order, and no update repeats the one before it of the same window. With
    a batch per record (``exact``), they are exactly the windows each record changed or
    made, in the order of their starts."""
    if exact:
        wanted: list[Result] = []
        before: dict[tuple[str, int, int], Any] = {}
        for state in states:
            changed = [w for w, v in state.items() if w not in before or before[w] != v]
            wanted.extend((*w, state[w]) for w in sorted(changed, key=lambda w: w[1]))
            before = state
        assert [u[:4] for u in updates] == wanted
    m, last = 0, {}
    for key, start, end, value, _ in updates:
        while m < len(states) and states[m].get((key, start, end), None) != value:
            m += 1
        assert m < len(states), ("not a window of the stream", key, start, end, value)
        assert last.get((key, start)) != value, ("a repeated update", key, start)
        last[key, start] = value


@pytest.mark.usefixtures("window_store")
async def test_kafka_streams_own_example() -> None:
    """``KStreamSlidingWindowAggregateTest.testAggregateSmallInput`` with emit-final:
    10 ms windows, 5 ms grace; the windows that have closed at stream time 30 ms."""
    records = [("A", ts, [n]) for n, ts in enumerate((10, 10, 14, 15, 20, 22, 30), 1)]
    kafka = [
        ("A", 0, 10, [1, 2]),
        ("A", 4, 14, [1, 2, 3]),
        ("A", 5, 15, [1, 2, 3, 4]),
        ("A", 10, 20, [1, 2, 3, 4, 5]),
        ("A", 11, 21, [3, 4, 5]),
        ("A", 12, 22, [3, 4, 5, 6]),
    ]
    assert reference(records, 10, 5) == (kafka, [])
    closed: list[Result] = []
    app, hits, _ = sliding_app(closed, [], grace=0.005, size=10)
    async with TestDriver(app, clock=FakeClock(), fail_fast=True) as driver:
        for key, ts, value in records:
            await driver.send(hits, Hit(key, ts, value[0]), key=key)
        await driver.run_until_idle()
    assert closed == kafka


@pytest.mark.usefixtures("window_store")
async def test_the_windows_of_a_few_records() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, recent = sliding_app(closed, [], grace=0)
    async with TestDriver(app, clock=clock) as driver:
        for s, n in ((0, 1), (4, 2), (12, 3)):
            await driver.send(hits, Hit("a", t0 + s * SECOND, n), key="a")
        await driver.run_until_idle()
        # The last 10 s at each record, and just after 0 s and 4 s left (1 ms later).
        assert recent.windows("a") == {
            flowkit.Window(t0 - 10_000, t0): [1],
            flowkit.Window(t0 - 6000, t0 + 4000): [1, 2],
            flowkit.Window(t0 + 1, t0 + 10_001): [2],
            flowkit.Window(t0 + 2000, t0 + 12_000): [2, 3],
            flowkit.Window(t0 + 4001, t0 + 14_001): [3],
        }
        assert recent["a"].value(t0 + 12_000) == [2, 3]  # the last 10 s up to 12 s
        assert recent["a"].value(t0 + 30_000) == []  # none: the table's default
        await driver.send(hits, Hit("b", t0 + 100 * SECOND), key="b")
        await driver.run_until_idle()
        # a's records have left (closed and expired); b's wait for its window to close.
        figures = status(driver.worker)["tables"]["recent"]
        assert (figures["keys"], figures["closed_windows"]) == (1, 5)
    assert [c[1:] for c in closed if c[0] == "a"] == [
        (t0 - 10_000, t0, [1]),
        (t0 - 6000, t0 + 4000, [1, 2]),
        (t0 + 1, t0 + 10_001, [2]),
        (t0 + 2000, t0 + 12_000, [2, 3]),
        (t0 + 4001, t0 + 14_001, [3]),
    ]


@pytest.mark.usefixtures("window_store")
async def test_a_declared_aggregation_over_two_partitions() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app = flowkit.App("sliding2", partitions=2)
    topic: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)

    def on_close(key: str, window: flowkit.Window, value: Any) -> None:
        closed.append((key, window.start, window.end, value))

    spend = app.table("spend").sliding(
        10.0, grace=0, aggregate=flowkit.Mean("n"), on_close=on_close
    )

    @app.agent(topic)
    async def add(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            spend.add(hit.user, hit, ts=hit.t)

    async with TestDriver(app, clock=clock) as driver:
        # One key's records on both partitions: the owner has them all.
        for s, n, p in ((0, 2, 0), (3, 4, 1), (200, 0, 0), (200, 0, 1)):
            await driver.send(topic, Hit("a" if n else "z", t0 + s * SECOND, n), partition=p)
        await driver.run_until_idle()
    assert [c for c in closed if c[0] == "a"] == [
        ("a", t0 - 10_000, t0, 2.0),
        ("a", t0 - 7000, t0 + 3000, 3.0),
        ("a", t0 + 1, t0 + 10_001, 4.0),
    ]


def test_declaration_errors_are_one_line() -> None:
    app = flowkit.App("decl")
    for args, kwargs, message in (
        ((0,), {}, "size must be > 0"),
        ((-1,), {}, "size must be >= 0"),
        (("soon",), {}, "size"),
        ((10,), {"grace": -1}, "grace must be >= 0"),
        ((10,), {"emit_on": "soon"}, "emit_on must be 'close' or 'update'"),
        ((10,), {"on_update": print}, "on_update is called with emit_on='update' only"),
        ((10,), {"aggregate": flowkit.Aggregation(int, operator.add)}, "has no merge"),
        ((10,), {"step": 1}, "has no option 'step'"),
    ):
        with pytest.raises(flowkit.DefinitionError, match=message) as info:
            app.table(f"t{len(app.tables)}").sliding(*args, **kwargs)
        assert "\n" not in str(info.value)
    recent = app.table("r", default=int).sliding(30.0)
    with pytest.raises(flowkit.DefinitionError, match=r"use r\.add"):
        recent["k"] = 3
    app.table("u").sliding(30.0, aggregate=flowkit.Count(), emit_on="update", on_update=print)
    graph = app.graph().to_dict()
    node = next(n for n in graph["nodes"] if n["id"] == "table:r")
    assert (node["window"], node["size"], node["grace"], node["expires"]) == (
        "sliding",
        30.0,
        30.0,
        60.0,
    )
    shown = {n["id"]: n.get("emit_on") for n in graph["nodes"]}
    assert (shown["table:r"], shown["table:u"]) == ("close", "update")
    # As every two-stage table: records go out to the repartition topic and come back.
    edges = {(e["source"], e["target"], e["kind"]) for e in graph["edges"]}
    assert {
        ("table:u", "topic:decl-u-changelog", "changelog"),
        ("table:u", "topic:decl-u-repartition", "partials"),
        ("topic:decl-u-repartition", "table:u", "combines"),
    } <= edges


def count_keys(store: Any) -> int:
    """Every reference the store holds to a key: unsent records, held records, and the
    close and expiry queues (on disk: its records and orders, there and not yet written)."""
    refs = sum(len(part.outbox) for part in store.parts.values())
    for owner in store.owners.owners.values():
        refs += len(owner.records) + len(owner.closing) + len(owner.expiring) + len(owner.dirty)
        disk = getattr(owner, "disk", None)
        if disk is not None:
            refs += sum(1 for prefix in b"Rcx" for _ in disk.items(bytes([prefix])))
    return refs


async def test_state_is_empty_once_every_window_closed_and_expired(
    window_store: WindowStores,
) -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    late: list[tuple[str, int]] = []
    app, hits, recent = sliding_app(closed, late, grace=0, partitions=2)
    async with TestDriver(app, clock=clock) as driver:
        for i in range(200):  # 20 users, disorder, on 2 partitions
            user = f"u{i % 20}"
            await driver.send(hits, Hit(user, t0 + (i * 7 % 150) * SECOND), partition=i % 2)
        await driver.run_until_idle()
        store = driver.store(recent)
        assert isinstance(store, DiskSlidingStore) == (window_store.kind == "rocksdb")
        assert count_keys(store) > 0
        for _ in range(3):  # quiet partitions: their watermarks move to the wall clock
            await driver.advance(30)
        assert count_keys(store) == 0
        assert list(recent) == []
    assert late  # with no grace, much of this disorder is late: counted, not lost
    assert {key for key, *_ in closed} == {f"u{i}" for i in range(20)}


@pytest.mark.usefixtures("window_store")
async def test_a_crash_repeats_windows_but_changes_none() -> None:
    """Killed after a checkpoint, with windows closed and emitted since: the successor
    replays from the checkpoint. Every window it emits is one of the reference's, with its
    exact value; only those emitted after the checkpoint may come twice."""
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    times = [0, 16, 40, 8, 60, 75, 30, 100, 95, 120, 180, 150, 170, 300, 310, 290, 600]
    records = [("a" if i % 3 else "b", t0 + s * SECOND, [i]) for i, s in enumerate(times)]
    expected, _ = reference(records, SIZE, 30 * SECOND)
    closed: list[Result] = []
    app, hits, _ = sliding_app(closed, [], grace=30)
    driver = TestDriver(app, broker=broker, clock=clock, commit_interval=3600)
    await driver.__aenter__()
    for user, ts, value in records[:6]:
        await driver.send(hits, Hit(user, ts, value[0]), key=user)
    await driver.run_until_idle()
    await driver.worker.checkpoint()
    before = len(closed)
    for user, ts, value in records[6:12]:
        await driver.send(hits, Hit(user, ts, value[0]), key=user)
    await driver.run_until_idle()
    since = closed[before:]
    assert since  # windows closed after the checkpoint, before the crash
    driver.worker._error = RuntimeError("simulated crash")  # no final flush or commit
    await driver.aclose()
    app, hits, _ = sliding_app(closed, [], grace=30)
    async with TestDriver(app, broker=broker, clock=clock) as again:
        for user, ts, value in records[12:]:
            await again.send(hits, Hit(user, ts, value[0]), key=user)
        await again.run_until_idle()
    distinct = [c for i, c in enumerate(closed) if c not in closed[:i]]
    assert sorted(distinct) == expected
    repeated = [c for c in distinct if closed.count(c) > 1]
    assert all(c in since for c in repeated)


@pytest.mark.usefixtures("window_store")
async def test_a_window_emitted_again_after_a_crash_is_marked_and_a_new_one_is_not() -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[tuple[str, int, int, Any, bool]] = []

    def make_app() -> tuple[flowkit.App, flowkit.Topic[Hit]]:
        app = flowkit.App("slidingmarks", partitions=1)
        hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)

        def report(key: str, w: flowkit.Window, value: Any, replayed: bool = False) -> None:
            closed.append((key, w.start - t0, w.end - t0, value, replayed))

        recent = app.table("recent").sliding(
            SIZE / 1000,
            grace=0,
            aggregate=flowkit.Sum("n"),
            time=lambda h: h.t,
            idle_timeout=None,
            on_close=report,
        )

        @app.agent(hits)
        async def add(stream: flowkit.Stream[Hit]) -> None:
            async for hit in stream:
                recent.add(hit.user, hit)

        return app, hits

    async def feed(driver: TestDriver, hits: Any, times: list[tuple[int, int]]) -> None:
        for s, n in times:
            await driver.send(hits, Hit("a", t0 + s * SECOND, n), key="a")
            await driver.run_until_idle()

    app, hits = make_app()
    driver = TestDriver(app, broker=broker, clock=clock, commit_interval=3600)
    await driver.__aenter__()
    await feed(driver, hits, [(0, 1), (5, 2), (30, 4)])
    first = [("a", -10_000, 0, 1, False), ("a", -5000, 5000, 3, False), ("a", 1, 10_001, 2, False)]
    assert closed == first
    driver.worker._error = RuntimeError("simulated crash")  # no final commit, no flush
    await driver.aclose()
    # The successor reads every record again: the same windows close a second time,
    # marked; the sources' records sent again are applied once.
    app, hits = make_app()
    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        await feed(again, hits, [(60, 8)])  # closes the window ending at 30 s: new
    assert closed[3:] == [(*c[:4], True) for c in first] + [("a", 20_000, 30_000, 4, False)]


@pytest.mark.usefixtures("window_store")
@pytest.mark.parametrize(
    "record",
    [
        b'["p", 0, 0, "a", 5]',
        b'["p", 0, 0, "a", [[1], 0, 0]]',
        b'["p", 0, 0, "a", [[1], "x", 1]]',
        # A record time no event time reaches (on disk, beyond what its orders hold).
        b'["p", 9223372036854775000, 0, "a", [[1], 0, 1]]',
    ],
)
async def test_a_forged_repartition_record_is_a_dead_letter(record: bytes) -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = sliding_app(closed, [], grace=0)
    async with TestDriver(app, clock=clock) as driver:
        await forge_and_close(driver, hits, t0, record)
    assert closed == [("a", t0 - SIZE, t0, [1])]  # the table goes on


@pytest.mark.parametrize("make_driver", ALL_CLIENTS[1:], indirect=True)
async def test_a_forged_repartition_record_is_a_dead_letter_on_kafka(
    make_driver: DriverFactory,
) -> None:
    # Anyone who can write the internal topic can forge its records: on the test broker
    # through both clients too (its envelope and partition are the broker's).
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = sliding_app(closed, [], grace=0)
    async with make_driver(app, clock=clock) as driver:
        await forge_and_close(driver, hits, t0, b'["p", 0, 0, "a", [[1], "x", 1]]')
    assert closed == [("a", t0 - SIZE, t0, [1])]


@pytest.mark.usefixtures("window_store")
async def test_a_late_record_is_a_dead_letter_naming_its_window_with_both_ends() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    app = flowkit.App("slidinglate", partitions=1)
    hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)
    recent = app.table("recent", default=int).sliding(10.0, grace=0, time=lambda h: h.t)

    @app.agent(hits)
    async def count(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            recent.add(hit.user, 1)

    async with TestDriver(app, clock=clock) as driver:
        for s in (100, 0):  # the second is late: [-10 s, 0] closed at 100 s
            await driver.send(hits, Hit("a", t0 + s * SECOND), key="a")
        await driver.run_until_idle()
        letters = await driver.dead_letters()
    assert [dict(m.headers)["flowkit.error.type"] for m in letters] == [b"LateRecord"]
    message = dict(letters[0].headers)["flowkit.error.message"].decode()
    assert f"([{t0 - SIZE}, {t0}] ms)" in message, message


async def forge_and_close(driver: TestDriver, hits: Any, t0: int, record: bytes) -> None:
    """A forged record on the repartition topic, then records that close a window: the
    forged one is the one dead letter, at stage decode."""
    await driver.send_raw("sliding-recent-repartition", record, partition=0)
    for s in (0, 100):
        await driver.send(hits, Hit("a", t0 + s * SECOND), key="a")
    await driver.run_until_idle()
    letters = await driver.dead_letters()
    assert [dict(m.headers)["flowkit.error.stage"] for m in letters] == [b"decode"]
    assert [m.value for m in letters] == [record]


@pytest.mark.usefixtures("window_store")
async def test_current_reads_the_last_size_at_each_record_inside_the_agent() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    app = flowkit.App("slidingreads", partitions=1)
    hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)
    recent = app.table("recent", default=list).sliding(10.0, time=lambda h: h.t)
    seen: list[Any] = []

    @app.agent(hits)
    async def collect(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            recent.add(hit.user, [hit.n])
            seen.append(recent[hit.user].current())  # added, not yet sent to the owner

    async with TestDriver(app, clock=clock) as driver:
        for s, n in ((0, 1), (4, 2), (12, 3), (12, 4), (13, 5)):
            await driver.send(hits, Hit("a", t0 + s * SECOND, n), key="a")
        await driver.run_until_idle()
    assert seen == [[1], [1, 2], [2, 3], [2, 3, 4], [2, 3, 4, 5]]  # [3 s, 13 s] holds 4 s
