"""Every declared aggregation, both emit modes, tumbling and hopping windows, held equal to
a plain-Python reference (window_reference.py) on random streams: disorder, late records
within and beyond grace, far-future records, gaps, batches of every size, and a worker
restart in the middle (the aggregates recovered from the changelog, or from local state and
its tail, go on exactly); on each store of windowed tables. On ``rocksdb://`` the owner
closes windows a key at a time (``DiskOwners.close_chunk = 1``), and a crash in the middle
of a close (its results sent, its changes not yet in the changelog) is followed by a new
worker that goes on with the half-closed windows: each result comes out with its final
value, and one that comes out again is marked as replayed.

One app per example holds a table per (aggregation, emit mode), all fed by one agent, so an
example checks them all with one worker run.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.state.windowed.disk_owner import CloseStep, DiskOwners
from flowkit.state.windowed.disk_stage1 import DiskStage1
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker
from tests.conftest import WindowStores

from .window_reference import Reference, aggregate

KINDS = ("count", "sum", "min", "max", "mean", "last", "collect", "distinct")
MODES = ("close", "update")


class Event(flowkit.Record):
    key: str
    t: int  # ms
    v: int


def declared(kind: str) -> flowkit.Aggregation:
    return {
        "count": flowkit.Count,
        "sum": lambda: flowkit.Sum("v"),
        "min": lambda: flowkit.Min("v"),
        "max": lambda: flowkit.Max("v"),
        "mean": lambda: flowkit.Mean("v"),
        "last": lambda: flowkit.Last("v"),
        "collect": lambda: flowkit.Collect("v", limit=3),
        "distinct": lambda: flowkit.DistinctCount("v"),
    }[kind]()


# (key, window, value, final, replayed: marked as emitted again)
Emitted = dict[tuple[str, str], list[tuple[str, tuple[int, int], Any, bool, bool]]]


def make_app(
    size: float, step: float, grace: float
) -> tuple[flowkit.App, Any, Emitted, dict[tuple[str, str], Any]]:
    app = flowkit.App("aggref", partitions=1)
    events = app.topic("events", value_type=Event)
    emitted: Emitted = {(kind, mode): [] for kind in KINDS for mode in MODES}
    tables: dict[tuple[str, str], Any] = {}
    for kind in KINDS:
        for mode in MODES:
            out = emitted[kind, mode]

            def on_close(
                k: str, w: flowkit.Window, v: Any, replayed: bool = False, out: Any = out
            ) -> None:
                out.append((k, (w.start, w.end), v, True, replayed))

            def on_update(k: str, w: flowkit.Window, v: Any, final: bool, out: Any = out) -> None:
                out.append((k, (w.start, w.end), v, final, False))

            callbacks: dict[str, Any] = (
                {"on_close": on_close} if mode == "close" else {"on_update": on_update}
            )
            table = app.table(f"{kind}-{mode}").hopping(
                size,
                step,
                grace=grace,
                time=lambda e: e.t,
                idle_timeout=None,
                late="drop",
                aggregate=declared(kind),
                emit_on=mode,
                **callbacks,
            )
            tables[kind, mode] = table

    @app.agent(events)
    async def aggregate(stream: flowkit.Stream[Event]) -> None:
        async for e in stream:
            for table in tables.values():
                table.add(e.key, e)

    return app, events, emitted, tables


windows = st.sampled_from([(10, 10), (10, 5), (6, 2)])  # (size, step) in seconds
# Steps in ms, on a 500 ms grid so records land on window edges and watermarks on window
# ends: forward up to 10 s (gaps), behind the newest up to 40 s (within grace or late),
# or far in the future (beyond max_future: refused).
offsets = st.lists(
    st.one_of(
        st.integers(0, 20).map(lambda n: n * 500),
        st.integers(1, 80).map(lambda n: -n * 500),
        st.just(10**10),
    ),
    min_size=8,
    max_size=40,
)


graces = st.sampled_from([0, 2, 10])


@dataclass(frozen=True)
class Example:
    """One drawn stream: the windows (size, step) and grace in seconds, the records' time
    steps (``offsets``), keys and values, how many go before each wait for the worker,
    and the wait before which a new worker takes over (0: none)."""

    window: tuple[int, int]
    grace: int
    steps: list[int]
    keys: list[str]
    values: list[int]
    batches: list[int]
    restart: int


def examples(keys: str = "ab", restart: bool = True) -> st.SearchStrategy[Example]:
    """Streams of records with ``keys``, and a restart in the middle or not."""
    return st.builds(
        Example,
        window=windows,
        grace=graces,
        steps=offsets,
        keys=st.lists(st.sampled_from(keys), min_size=40, max_size=40),
        values=st.lists(st.integers(-5, 5), min_size=40, max_size=40),
        batches=st.lists(st.integers(1, 8), min_size=2, max_size=20),
        restart=st.integers(0, 4) if restart else st.just(0),
    )


# On rocksdb:// each example opens a database per table and partition (16 here, about
# 50 ms each): fewer examples in CI, more with FLOWKIT_WINDOW_EXAMPLES_DISK.
on_disk = pytest.mark.parametrize("window_store", ["rocksdb"], indirect=True)
disk_examples = settings(
    max_examples=int(os.environ.get("FLOWKIT_WINDOW_EXAMPLES_DISK", "2")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@settings(
    max_examples=int(os.environ.get("FLOWKIT_WINDOW_EXAMPLES", "8")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(example=examples())
def test_every_result_matches_the_reference(example: Example) -> None:
    run_example(example)


@on_disk
@disk_examples
@given(example=examples())
def test_every_result_matches_the_reference_on_disk(
    window_store: WindowStores, example: Example
) -> None:
    window_store.fresh()  # each example's own local state
    run_example(example)


# Many keys a window on rocksdb://, shipped a partial at a time (DiskStage1.chunk = 1): every
# close crosses chunk boundaries, and the agents and checkpoints run between the chunks.
@on_disk
@disk_examples
@given(example=examples("abcdefgh"))
def test_every_result_matches_the_reference_on_disk_a_partial_at_a_time(
    window_store: WindowStores, monkeypatch: pytest.MonkeyPatch, example: Example
) -> None:
    window_store.fresh()
    monkeypatch.setattr(DiskStage1, "chunk", 1)
    run_example(example)


class Crash(Exception):
    """The worker dies in the middle of a close (``DiskOwners.stepped`` never returns)."""


STEPPED = DiskOwners.stepped  # (the examples patch it, each on the original)


# On rocksdb://, the owner's close a key at a time, and a crash after the results of the
# ``crash``-th step (of any table) went out and before its changes went anywhere: the
# next worker goes on with the half-closed windows.
@on_disk
@disk_examples
@given(example=examples("abcdefgh", restart=False), crash=st.integers(1, 40))
def test_every_result_matches_the_reference_on_disk_over_a_crash_mid_close(
    window_store: WindowStores, monkeypatch: pytest.MonkeyPatch, example: Example, crash: int
) -> None:
    window_store.fresh()
    monkeypatch.setattr(DiskOwners, "close_chunk", 1)
    count = [0]

    def crashing(self: DiskOwners, step: CloseStep) -> None:
        count[0] += 1
        if count[0] == crash:
            raise Crash(f"step {crash}")
        STEPPED(self, step)

    monkeypatch.setattr(DiskOwners, "stepped", crashing)
    run_example(example, crashes=True)


def run_example(example: Example, crashes: bool = False) -> None:
    (size, step), grace, steps = example.window, example.grace, example.steps
    keys, values, batches = example.keys, example.values, example.batches
    clock = FakeClock()
    now = int(clock.time() * 1000) - 600_000
    start = now - now % 60_000
    times, t = [], start + 60_000
    for s in steps:
        if s >= 10**10:
            times.append(int(clock.time() * 1000) + 2 * 3_600_000)  # far future
        else:
            if s >= 0:
                t += s
                times.append(t)
            else:
                times.append(max(start, t + s))  # behind the newest: within grace or late
    events = [Event(keys[i], ts, values[i]) for i, ts in enumerate(times)]
    # The records sent before each wait for the worker: one fetched batch, or a few.
    chunks = [0]
    for n in batches:
        chunks.append(min(chunks[-1] + n, len(events)))
    if chunks[-1] < len(events):
        chunks.append(len(events))
    asyncio.run(_run(size, step, grace, clock, events, chunks, example.restart, crashes))


async def _run(
    size: int,
    step: int,
    grace: int,
    clock: FakeClock,
    events: list[Event],
    chunks: list[int],
    restart: int,
    crashes: bool = False,
) -> None:
    app, topic, emitted, tables = make_app(size, step, grace)
    ref = Reference(size * 1000, step * 1000, grace * 1000, int(clock.time() * 1000) + 3_600_000)
    broker = MemoryBroker()
    driver = TestDriver(app, broker=broker, clock=clock)
    await driver.__aenter__()
    try:
        for i, (a, b) in enumerate(itertools.pairwise(chunks)):
            if i == restart and i > 0:  # a graceful stop and a new worker on the same state
                await driver.aclose()
                driver = TestDriver(app, broker=broker, clock=clock)
                await driver.__aenter__()
            for e in events[a:b]:
                await driver.send(topic, e, key=e.key)
                ref.add(e.key, e.t, e.v)
            try:
                await driver.run_until_idle()
            except Crash:
                # Dead in the middle of a close: no final checkpoint; the next worker
                # opens the same state and reads what was not committed again.
                await driver.aclose()
                driver = TestDriver(app, broker=broker, clock=clock)
                await driver.__aenter__()
                await driver.run_until_idle()
        # Reads of the windows still open: every record so far (one worker holds all).
        for (kind, _), table in tables.items():
            for (key, w), values in ref.values.items():
                if (key, w) not in ref.closed:
                    read = table.windows(key)[flowkit.Window(*w)]
                    assert read == aggregate(kind, values), (kind, key, w)
    finally:
        await driver.aclose()
    for kind in KINDS:
        finals = ref.finals(kind)
        for mode in MODES:
            check(kind, mode, ref, finals, emitted[kind, mode], crashes)


def close_enough(kind: str, got: Any, want: Any) -> bool:
    # DistinctCount is exact at the few dozen values of an example (below 64).
    return bool(got == want)


def check(
    kind: str,
    mode: str,
    ref: Reference,
    finals: dict[Any, Any],
    out: list[Any],
    crashes: bool = False,
) -> None:
    what = f"{kind}, emit on {mode}"
    got_finals: dict[Any, Any] = {}
    for k, w, v, final, replayed in out:
        if not final:
            continue
        if (k, w) in got_finals:
            # Only after a crash, and marked (an on_update learns no mark).
            assert crashes and (replayed or mode == "update"), f"{what}: a final twice"
            assert got_finals[k, w] == v, f"{what}: {(k, w)} came out again, changed"
        got_finals[k, w] = v
    assert got_finals.keys() == finals.keys(), what
    for kw, want in finals.items():
        assert close_enough(kind, got_finals[kw], want), (what, kw, got_finals[kw], want)
    if mode == "close":
        assert all(final for *_, final, _ in out), what
        return
    if crashes:
        return  # running updates may repeat after a crash (at-least-once)
    # Running updates: in the order each (key, window) went through its values, none after
    # its final, each a value the reference had after some add.
    seen_final: set[Any] = set()
    progress: dict[Any, int] = {}
    for k, w, v, final, _ in out:
        assert (k, w) not in seen_final, f"{what}: an update after the final"
        if final:
            seen_final.add((k, w))
            continue
        path = ref.updates(kind, k, w)
        i = progress.get((k, w), 0)
        while i < len(path) and not close_enough(kind, v, path[i]):
            i += 1
        assert i < len(path), (what, k, w, v, path)
        progress[k, w] = i + 1
