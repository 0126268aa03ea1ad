"""Session windows: Kafka Streams' ``SessionWindows`` semantics, checked against a
plain-Python reference on random streams, across restarts, and for bounded state."""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports.memory import MemoryBroker
from tests.conftest import ALL_CLIENTS, DriverFactory, WindowStores

# The suites of sessions run on both stores (``window_store``, tests/conftest.py): each
# Hypothesis example gets its own local state with ``window_store.fresh()``.
ON_EACH_STORE = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

GAP, SECOND = 10_000, 1000
Result = tuple[str, int, int, Any]  # key, start, end, value


class Hit(flowkit.Record):
    user: str
    t: int  # event time, ms
    n: int = 1


def reference(
    records: Iterable[tuple[str, int, Any]],
    gap: int,
    grace: int,
    merge: Callable[[Any, Any], Any] = operator.add,
    states: list[list[Result]] | None = None,
) -> tuple[list[Result], list[tuple[str, int]]]:
    """Kafka Streams' session aggregation over one partition, in plain Python: the
    sessions emitted when they close, and the late records. A session is [start, end,
    value]; a record joins the sessions within ``gap`` of it (bounds included), merging
    them (their values in time order, then the record's, with ``merge``); a session
    closes once it ends before stream time - grace - gap, and a record whose session
    would is late. ``states`` gets the open sessions after each record."""
    stream_time = -(2**62)
    open_: dict[str, list[list[Any]]] = {}
    closed: list[Result] = []
    late: list[tuple[str, int]] = []
    for key, ts, value in records:
        stream_time = max(stream_time, ts)
        close_time = stream_time - grace - gap
        for k, sessions in open_.items():
            for s in [s for s in sessions if s[1] < close_time]:
                sessions.remove(s)
                closed.append((k, s[0], s[1], s[2]))
        sessions = open_.setdefault(key, [])
        found = [s for s in sessions if s[0] - gap <= ts <= s[1] + gap]
        if not found and ts < close_time:
            late.append((key, ts))
            continue
        total: Any = None
        for s in found:
            sessions.remove(s)
            total = s[2] if total is None else merge(total, s[2])
        start = min([ts, *(s[0] for s in found)])
        end = max([ts, *(s[1] for s in found)])
        sessions.append([start, end, value if total is None else merge(total, value)])
        sessions.sort(key=lambda s: s[0])
        if states is not None:
            states.append([(k, s[0], s[1], s[2]) for k, ss in open_.items() for s in ss])
    return sorted(closed), sorted(late)


def session_app(
    closed: list[Result],
    late: list[tuple[str, int]],
    *,
    grace: float,
    partitions: int = 1,
    emit_on: str = "close",
) -> tuple[flowkit.App, Any, Any]:
    app = flowkit.App("sessions", partitions=partitions)
    hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)

    def on_close(key: str, window: flowkit.Window, value: Any) -> None:
        closed.append((key, window.start, window.end, value))

    def on_late(key: str, window: flowkit.Window, value: Any) -> None:
        late.append((key, window.start))

    visits = app.table("visits", default=list).session(
        GAP / 1000,
        grace=grace,
        combine=operator.add,
        time=lambda h: h.t,
        on_close=on_close,
        late=on_late,
        emit_on=emit_on,
    )

    @app.agent(hits)
    async def count(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            visits.add(hit.user, [hit.n])

    return app, hits, visits


def base_ms(clock: FakeClock) -> int:
    return int(clock.time() * 1000) - 3_600_000


# Offsets in seconds from a base time: mostly a busy minute (disorder, gaps, bridges),
# some far ahead (which make what follows late beyond grace).
offsets = st.one_of(
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(60, 120),
)
streams = st.lists(st.tuples(st.sampled_from("ab"), offsets), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=ON_EACH_STORE)
@given(
    stream=streams,
    grace=st.sampled_from([0, 5, 30]),
    # After how many records the worker stops, and how: gracefully, or a crash with no
    # final checkpoint (the records since the last one are read again).
    restart=st.none() | st.tuples(st.integers(1, 30), st.booleans()),
    emit_on=st.sampled_from(["close", "update"]),
)
# a[60] closes on its source when a[101] comes; a[61], on time after it, is a session of
# its own, though it reaches the owner in the batch that brings a[60].
@example(
    stream=[("b", 60), ("a", 60), ("a", 101), ("a", 61)], grace=30, restart=None, emit_on="close"
)
# The owner holds a running copy of a[60] (open on its source) through a restart; b[60]'s
# watermark would close that copy, but not a[60, 61] on its source: it waits for it.
@example(
    stream=[("a", 0), ("a", 0), ("a", 60), ("a", 61), ("b", 60)],
    grace=0,
    restart=(3, False),
    emit_on="update",
)
async def test_every_session_emitted_matches_the_reference(
    window_store: WindowStores,
    stream: list[tuple[str, int]],
    grace: int,
    restart: tuple[int, bool] | None,
    emit_on: str,
) -> None:
    window_store.fresh()  # each example's own local state
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    records = [(user, t0 + s * SECOND, [i]) for i, (user, s) in enumerate(stream)]
    # Then a record far ahead, of a key of its own: every session closes.
    records.append(("end", t0 + 2000 * SECOND, [-1]))
    expected, expected_late = reference(records, GAP, grace * SECOND)
    closed: list[Result] = []
    late: list[tuple[str, int]] = []
    at, crash = restart or (len(records), False)
    app, hits, _ = session_app(closed, late, grace=grace, emit_on=emit_on)
    driver = TestDriver(app, broker=broker, clock=clock, fail_fast=True)
    await driver.__aenter__()
    try:
        for i, (user, ts, value) in enumerate(records):
            if i == at:
                await driver.run_until_idle()
                if crash:
                    driver.worker._error = RuntimeError("simulated crash")
                await driver.aclose()
                app, hits, _ = session_app(closed, late, grace=grace, emit_on=emit_on)
                driver = TestDriver(app, broker=broker, clock=clock, fail_fast=True)
                await driver.__aenter__()
            await driver.send(hits, Hit(user, ts, value[0]), key=user)
        await driver.run_until_idle()
    finally:
        await driver.aclose()
    if not crash:
        assert sorted(closed) == expected, (closed, expected)
        assert sorted(late) == expected_late
    else:  # at least once: what is emitted twice is the same
        distinct = [c for i, c in enumerate(closed) if c not in closed[:i]]
        assert sorted(distinct) == expected, (closed, expected)
        assert sorted(set(late)) == sorted(set(expected_late))


AGGREGATIONS = {
    "count": flowkit.Count(),
    "sum": flowkit.Sum("n"),
    "max": flowkit.Max("n"),
    "mean": flowkit.Mean("n"),
    "last": flowkit.Last("n"),
    "collect": flowkit.Collect("n", limit=3),  # order-sensitive, and bounded
    "distinct": flowkit.DistinctCount("n"),
}
Update = tuple[str, int, int, Any, bool]  # key, start, end, value, final


def one(aggregation: flowkit.Aggregation, hit: Hit) -> Any:
    """A record's accumulator, as a session table makes it before merging."""
    if aggregation.timed:
        return aggregation.add(aggregation.initial(), hit, hit.t)
    return aggregation.add(aggregation.initial(), hit)


@settings(
    max_examples=int(os.environ.get("FLOWKIT_SESSION_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=ON_EACH_STORE,
)
@example(  # an outdated copy of a session must not close in place of its final version
    stream=[("a", 0), ("a", 0), ("a", 60), ("a", 61), ("b", 60)],
    grace=0,
    name="collect",
    emit_on="update",
    flush_every=3,
)
@given(
    stream=streams,
    grace=st.sampled_from([0, 5, 30]),
    name=st.sampled_from(sorted(AGGREGATIONS)),
    emit_on=st.sampled_from(["close", "update"]),
    flush_every=st.sampled_from([1, 3, 100]),
)
async def test_aggregations_and_running_updates_match_the_reference(
    window_store: WindowStores,
    stream: list[tuple[str, int]],
    grace: int,
    name: str,
    emit_on: str,
    flush_every: int,
) -> None:
    window_store.fresh()
    aggregation = AGGREGATIONS[name]
    clock = FakeClock()
    t0 = base_ms(clock)
    hits = [Hit(user, t0 + s * SECOND, i % 4) for i, (user, s) in enumerate(stream)]
    hits.append(Hit("end", t0 + 2000 * SECOND, 0))
    states: list[list[Result]] = []
    records = [(h.user, h.t, one(aggregation, h)) for h in hits]
    closed_acc, expected_late = reference(
        records,
        GAP,
        grace * SECOND,
        aggregation.merge,
        states,  # type: ignore[arg-type]
    )
    expected = sorted((k, s, e, aggregation.finish(v)) for k, s, e, v in closed_acc)
    app = flowkit.App("sessions", partitions=1)
    topic: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)
    closed: list[Result] = []
    updates: list[Update] = []
    late: list[Any] = []
    table = app.table("visits").session(
        GAP / 1000,
        grace=grace,
        aggregate=aggregation,
        emit_on=emit_on,
        time=lambda h: h.t,
        on_close=lambda key, w, value: closed.append((key, w.start, w.end, value)),
        on_update=(
            (lambda key, w, value, final: updates.append((key, w.start, w.end, value, final)))
            if emit_on == "update"
            else None
        ),
        late=lambda key, w, record: late.append((key, record.t)),
    )

    @app.agent(topic)
    async def visit(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            table.add(hit.user, hit)

    async with TestDriver(app, clock=clock, fail_fast=True) as driver:
        for i, hit in enumerate(hits):
            await driver.send(topic, hit, key=hit.user)
            if i % flush_every == flush_every - 1:
                await driver.run_until_idle()
        await driver.run_until_idle()
    assert sorted(closed) == expected, (closed, expected)
    assert sorted(late) == expected_late  # late= gets the record
    if emit_on == "close":
        return
    assert sorted(u[:4] for u in updates if u[4]) == expected  # each final once
    # Every running update is a session as it stood after some prefix of the stream,
    # the prefixes in order; and no update repeats the one before it for the same key.
    finished = [[(k, s, e, aggregation.finish(v)) for k, s, e, v in state] for state in states]
    m, last = 0, {}
    for key, start, end, value, final in updates:
        if final:
            last.pop(key, None)
            continue
        while m < len(finished) and (key, start, end, value) not in finished[m]:
            m += 1
        assert m < len(finished), ("not a session of the stream", key, start, end, value)
        assert last.get(key) != (start, end, value), ("a repeated update", key, start, end)
        last[key] = (start, end, value)
    assert any(not u[4] for u in updates)


@pytest.mark.usefixtures("window_store")
async def test_a_record_that_bridges_two_sessions_merges_them() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, visits = session_app(closed, [], grace=30)
    async with TestDriver(app, clock=clock) as driver:
        for s, n in ((0, 1), (4, 2), (16, 3)):
            await driver.send(hits, Hit("a", t0 + s * SECOND, n), key="a")
        await driver.run_until_idle()
        assert visits.windows("a") == {
            flowkit.Window(t0, t0 + 4000): [1, 2],
            flowkit.Window(t0 + 16_000, t0 + 16_000): [3],
        }
        await driver.send(hits, Hit("a", t0 + 10 * SECOND, 4), key="a")  # 6 s from both
        await driver.run_until_idle()
        assert visits.windows("a") == {flowkit.Window(t0, t0 + 16_000): [1, 2, 3, 4]}
        assert visits["a"].value(t0 + 100_000) == [1, 2, 3, 4]  # the latest session
        await driver.send(hits, Hit("b", t0 + 100 * SECOND), key="b")
        await driver.run_until_idle()
    assert closed == [("a", t0, t0 + 16_000, [1, 2, 3, 4])]


def test_session_needs_combine_and_refuses_assignment() -> None:
    app = flowkit.App("decl")
    with pytest.raises(flowkit.DefinitionError, match="session\\(\\) needs combine="):
        app.table("visits", default=int).session(30.0)
    with pytest.raises(flowkit.DefinitionError, match="gap must be > 0"):
        app.table("v0", default=int).session(0, combine=operator.add)
    with pytest.raises(flowkit.DefinitionError, match="has no option 'size'"):
        app.table("v1", default=int).session(1, combine=operator.add, size=3)
    no_merge = flowkit.Aggregation(initial=list, add=lambda acc, v: [*acc, v])
    with pytest.raises(flowkit.DefinitionError, match="session windows merge accumulators"):
        app.table("v-nomerge").session(1, aggregate=no_merge)
    with pytest.raises(flowkit.DefinitionError, match="give aggregate= or combine=, not both"):
        app.table("v-both").session(1, aggregate=flowkit.Count(), combine=max)
    counted = app.table("v-count").session(1, aggregate=flowkit.Count(), emit_on="update")
    assert (counted.describe()["aggregate"], counted.describe()["emit_on"]) == ("count", "update")
    visits = app.table("v2", default=int).session(30.0, combine=operator.add)
    with pytest.raises(flowkit.DefinitionError, match=r"use v2\.add"):
        visits["k"] = 3
    node = next(n for n in app.graph().to_dict()["nodes"] if n["id"] == "table:v2")
    assert (node["window"], node["gap"], node["grace"], node["expires"]) == (
        "session",
        30.0,
        30.0,
        60.0,
    )


def count_keys(store: Any) -> int:
    """Every reference the store holds to a key: sessions, closed results, and the
    close and expiry queues."""
    refs = 0
    for part in store.parts.values():
        refs += len(part.partials) + len(part.closing) + len(part.dirty)
    for owner in store.owners.owners.values():
        refs += len(owner.open) + len(owner.closed) + len(owner.closing) + len(owner.expiring)
        refs += len(owner.dirty) + len(owner.dirty_closed)
        refs += len(list(store.owners.closed_keys(owner)))  # on disk with rocksdb://
    return refs


@pytest.mark.usefixtures("window_store")
async def test_state_is_empty_once_every_session_closed_and_expired() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    late: list[tuple[str, int]] = []
    app, hits, visits = session_app(closed, late, grace=0, partitions=2)
    async with TestDriver(app, clock=clock) as driver:
        for i in range(200):  # 20 users, sessions merging and splitting on 2 partitions
            user = f"u{i % 20}"
            await driver.send(hits, Hit(user, t0 + (i * 7 % 150) * SECOND), partition=i % 2)
        await driver.run_until_idle()
        store = driver.store(visits)
        assert count_keys(store) > 0
        for _ in range(3):  # quiet partitions: their watermarks move to the wall clock
            await driver.advance(30)
        assert count_keys(store) == 0
        assert list(visits) == []
    assert late  # with no grace, much of this disorder is late: counted, not lost
    assert sum(len(value) for *_, value in closed) + len(late) == 200
    assert {key for key, *_ in closed} == {f"u{i}" for i in range(20)}


@pytest.mark.usefixtures("window_store")
async def test_merged_and_closed_sessions_do_not_come_back_after_a_restart() -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = session_app(closed, [], grace=30)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        for s, n in ((0, 1), (16, 2), (8, 3), (200, 4), (230, 5)):  # 8 s bridges 0 and 16
            await driver.send(hits, Hit("a", t0 + s * SECOND, n), key="a")
        await driver.run_until_idle()
    assert closed == [("a", t0, t0 + 16_000, [1, 2, 3])]
    app, hits, visits = session_app(closed, [], grace=30)
    async with TestDriver(app, broker=broker, clock=clock) as driver:
        await driver.run_until_idle()  # the partitions are assigned and recovered
        # The merged sessions' parts and the closed and expired session are gone from
        # the changelog: only the open sessions come back.
        assert visits.windows("a") == {
            flowkit.Window(t0 + 200_000, t0 + 200_000): [4],
            flowkit.Window(t0 + 230_000, t0 + 230_000): [5],
        }
        await driver.send(hits, Hit("a", t0 + 205 * SECOND, 6), key="a")
        await driver.send(hits, Hit("b", t0 + 900 * SECOND), key="b")
        await driver.run_until_idle()
    assert closed == [
        ("a", t0, t0 + 16_000, [1, 2, 3]),
        ("a", t0 + 200_000, t0 + 205_000, [4, 6]),
        ("a", t0 + 230_000, t0 + 230_000, [5]),
    ]


@pytest.mark.parametrize("emit_on", ["close", "update"])
@pytest.mark.usefixtures("window_store")
async def test_sessions_from_several_partitions_merge_on_the_owner(emit_on: str) -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = session_app(closed, [], grace=0, partitions=2, emit_on=emit_on)
    async with TestDriver(app, clock=clock) as driver:
        # The key's records on both partitions: [0, 5 s] on one, [12 s] on the other,
        # 7 s apart: one session once the owner has both.
        for s, n, p in ((0, 1, 0), (5, 2, 0), (12, 3, 1), (200, 0, 0), (200, 0, 1)):
            await driver.send(hits, Hit("a" if n else "b", t0 + s * SECOND, n), partition=p)
        await driver.run_until_idle()
    assert closed == [("a", t0, t0 + 12_000, [1, 2, 3])]


@pytest.mark.parametrize(
    "record",
    [b'["p", 0, 0, "a", 5]', b'["p", 10000, 0, "a", [5, [1], 0]]', b'["p", 0, 0, "a", [1]]'],
)
@pytest.mark.usefixtures("window_store")
async def test_a_forged_repartition_record_is_a_dead_letter(record: bytes) -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = session_app(closed, [], grace=0)
    async with TestDriver(app, clock=clock) as driver:
        await forge_and_count(driver, hits, t0, record)
    assert closed == [("a", t0, t0, [1])]  # the table goes on


@pytest.mark.parametrize("make_driver", ALL_CLIENTS, indirect=True)
async def test_a_forged_repartition_record_is_a_dead_letter_on_every_broker(
    make_driver: DriverFactory,
) -> None:
    # Anyone who can write the internal topic can forge its records: on Kafka through both
    # clients too (its envelope and partition are the broker's).
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = session_app(closed, [], grace=0)
    async with make_driver(app, clock=clock) as driver:
        await forge_and_count(driver, hits, t0, b'["p", 0, 0, "a", 5]')
    assert closed == [("a", t0, t0, [1])]


async def forge_and_count(driver: TestDriver, hits: Any, t0: int, record: bytes) -> None:
    """A forged record on the repartition topic, then records that close a session: the
    forged one is the one dead letter, at stage decode."""
    await driver.send_raw("sessions-visits-repartition", record, partition=0)
    for s in (0, 100):
        await driver.send(hits, Hit("a", t0 + s * SECOND), key="a")
    await driver.run_until_idle()
    letters = await driver.dead_letters()
    assert [dict(m.headers)["flowkit.error.stage"] for m in letters] == [b"decode"]
    assert [m.value for m in letters] == [record]


@pytest.mark.parametrize("emit_on", ["close", "update"])
@pytest.mark.usefixtures("window_store")
async def test_a_crash_repeats_sessions_but_changes_none(emit_on: str) -> None:
    """Killed after a checkpoint, with sessions merged, closed and emitted since: the
    successor replays from the checkpoint. Every session it emits is one of the reference's,
    with its exact value; only those emitted after the checkpoint may come twice. With
    running updates too: the open sessions the owner had are replaced, not added to."""
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    times = [0, 16, 40, 8, 60, 75, 30, 100, 95, 120, 180, 150, 170, 300, 310, 290, 600]
    records = [("a" if i % 3 else "b", t0 + s * SECOND, [i]) for i, s in enumerate(times)]
    expected, _ = reference(records, GAP, 30 * SECOND)
    closed: list[Result] = []
    app, hits, _ = session_app(closed, [], grace=30, emit_on=emit_on)
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
    assert since  # sessions closed after the checkpoint, before the crash
    driver.worker._error = RuntimeError("simulated crash")  # no final flush or commit
    await driver.aclose()
    app, hits, _ = session_app(closed, [], grace=30, emit_on=emit_on)
    async with TestDriver(app, broker=broker, clock=clock) as again:
        for user, ts, value in records[12:]:
            await again.send(hits, Hit(user, ts, value[0]), key=user)
        await again.run_until_idle()
    distinct = [c for i, c in enumerate(closed) if c not in closed[:i]]
    assert sorted(distinct) == expected
    repeated = [c for c in distinct if closed.count(c) > 1]
    assert all(c in since for c in repeated)


@pytest.mark.usefixtures("window_store")
async def test_a_session_emitted_again_after_a_crash_is_marked_and_a_new_one_is_not() -> None:
    broker, clock = MemoryBroker(), FakeClock()
    t0 = base_ms(clock)
    closed: list[tuple[str, int, int, Any, bool]] = []

    def make_app() -> tuple[flowkit.App, flowkit.Topic[Hit]]:
        app = flowkit.App("sessions", partitions=1)
        hits: flowkit.Topic[Hit] = app.topic("hits", value_type=Hit)

        def report(key: str, w: flowkit.Window, value: Any, replayed: bool = False) -> None:
            closed.append((key, w.start - t0, w.end - t0, value, replayed))

        visits = app.table("visits").session(
            GAP / 1000,
            grace=0,
            aggregate=flowkit.Mean("n"),
            time=lambda h: h.t,
            idle_timeout=None,
            on_close=report,
        )

        @app.agent(hits)
        async def visit(stream: flowkit.Stream[Hit]) -> None:
            async for hit in stream:
                visits.add(hit.user, hit)

        return app, hits

    async def feed(driver: TestDriver, hits: Any, times: list[tuple[int, int]]) -> None:
        for s, n in times:
            await driver.send(hits, Hit("a", t0 + s * SECOND, n), key="a")
            await driver.run_until_idle()

    app, hits = make_app()
    driver = TestDriver(app, broker=broker, clock=clock, commit_interval=3600)
    await driver.__aenter__()
    await feed(driver, hits, [(0, 1), (5, 2), (30, 6)])
    assert closed == [("a", 0, 5000, 1.5, False)]
    driver.worker._error = RuntimeError("simulated crash")  # no final commit, no flush
    await driver.aclose()
    # The successor reads every record again: the first session closes a second time.
    app, hits = make_app()
    async with TestDriver(app, broker=broker, clock=clock) as again:
        await again.run_until_idle()
        await feed(again, hits, [(60, 0)])  # closes the second session: new
    assert closed[1:] == [("a", 0, 5000, 1.5, True), ("a", 30_000, 30_000, 6.0, False)]
