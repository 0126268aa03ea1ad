"""Windows from the future on a windowed table's own topics: a stage-1 partial, an owner's
partial, a closed window's value, a session or a sliding table's record whose window
starts or ends (or whose record time is) beyond ``max_future`` ahead of the wall clock,
forged on the changelog or the repartition topic. No record the table writes can be
there (its source refused the event time), and a window there would be held for good: it
never closes, so it never expires. Each is dead-lettered (stage ``decode``, its reason
naming ``max_future``) and the table holds nothing of it, on both stores. Markers that
far ahead are ignored already (tests/state/test_future_records.py)."""

from __future__ import annotations

import operator
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.deadletter import DeadLetter
from flowkit.state.windowed import wire
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport
from tests.conftest import WindowStores

MAX_FUTURE = 3_600_000  # the default, in ms


class Hit(flowkit.Record):
    user: str
    t: int


def future_app() -> tuple[flowkit.App, list[Any]]:
    app = flowkit.App("future", partitions=1)
    hits = app.topic("hits", value_type=Hit)
    counts = app.table("counts", default=int).tumbling(10.0, time=lambda h: h.t)
    recent = app.table("recent", default=int).sliding(10.0, time=lambda h: h.t)
    visits = app.table("visits", default=int).session(3.0, combine=operator.add, time=lambda h: h.t)

    @app.agent(hits)
    async def count(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            counts[hit.user] += 1
            recent.add(hit.user, 1)
            visits.add(hit.user, 1)

    return app, [counts, recent, visits]


def forged(at: int, now: int) -> list[tuple[str, bytes, bytes]]:
    """Records of the tables' shapes at time ``at``, for the user ``u``."""
    changelog, repartition = "future-{}-changelog", "future-{}-repartition"
    return [
        (changelog.format("counts"), wire.partial_key(at, "u"), b"1"),
        (changelog.format("counts"), wire.owned_key(at, "u", 0), b"1"),
        (changelog.format("counts"), wire.closed_key(at, "u"), b"1"),
        (repartition.format("counts"), b"u", wire.partial(at, 0, "u", 1)),
        (changelog.format("recent"), wire.encode(("R", "u", at)), b"[1]"),
        (repartition.format("recent"), b"u", wire.partial(at, 0, "u", [1, 0, 10**6])),
        (changelog.format("visits"), wire.encode(("S", "u")), wire.encode([[now, at, 1]])),
        (changelog.format("visits"), wire.encode(("O", "u")), wire.encode([[at, at, []]])),
        (changelog.format("visits"), wire.encode(("C", "u")), wire.encode([[at, at, 1]])),
        (repartition.format("visits"), b"u", wire.partial(at, 0, "u", [at, 1, 0])),
        (repartition.format("visits"), b"u", wire.partial(now, 0, "u", [at, 1, 0])),
    ]


@settings(
    max_examples=int(os.environ.get("FLOWKIT_TEST_EXAMPLES", "4")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ahead=st.integers(MAX_FUTURE + 1, 2**63 - 1) | st.integers(MAX_FUTURE + 1, 10**9))
async def test_a_window_beyond_max_future_is_a_dead_letter(
    window_store: WindowStores, ahead: int
) -> None:
    window_store.fresh()
    broker, clock = MemoryBroker(), FakeClock()
    now = int(clock.time() * 1000)
    at = min(now + ahead, 2**63 - 1)
    app, _ = future_app()
    async with TestDriver(app, broker=broker, clock=clock, fail_fast=True) as driver:
        await driver.send("hits", Hit("u", now), key="u")
        await driver.run_until_idle()
    # Written while no worker runs: the next start reads the changelog's from its tail
    # (the records after its local state's stamp), the repartition topic's as they come.
    records = forged(at, now)
    producer = MemoryTransport(broker).producer(client_id="forger")
    await producer.start()
    for topic, key, value in records:
        await producer.send(topic, value, key=key, partition=0, timestamp_ms=now)
    await producer.aclose()
    for _ in range(2):  # and a restart after that run
        app, tables = future_app()
        async with TestDriver(app, broker=broker, clock=clock) as driver:
            await driver.run_until_idle()
            for table in tables:
                assert max(w.end for w in table.windows("u")) <= now + 20_000, table.name
            letters = [DeadLetter(m) for m in await driver.dead_letters()]
    # Each one (on the memory store, a start rebuilds from the whole changelog: again).
    assert {(d.source_topic, d.message.key, d.message.value) for d in letters} == set(records)
    for d in letters:
        assert (d.stage, d.error_type) == ("decode", "DecodeError")
        assert "max_future" in d.error_message, d.error_message
