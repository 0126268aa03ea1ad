"""Standby copies of every partitioned table kind (tumbling, session and sliding windows,
a stream-stream join's buffers), on both stores: a copy that followed a prefix of a
partition's changelog, taken over, then fed the rest (the gap) is the state a full
replay of the whole changelog builds, records the changelog holds that no table does
included (dead-lettered once, by the new owner). The changelogs are those a worker wrote
(on ``rocksdb://`` with closes in small steps, so a window closing in steps is cut in
the middle); Hypothesis draws where each is cut, in how many pieces the copy reads its
part, and forged records slipped in."""

from __future__ import annotations

import asyncio
import collections
import operator
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.records import Message
from flowkit.runtime import required_topics
from flowkit.runtime.tables import standby
from flowkit.runtime.tables.keeper import StateKeeper
from flowkit.runtime.tables.standby import OnDisk
from flowkit.state.databases import open_db, open_rocksdict
from flowkit.state.windowed.disk_owner import DiskOwners
from flowkit.testing import FakeClock, TestDriver
from flowkit.transports import MemoryBroker, MemoryTransport

KINDS = ("per-window", "sessions", "recent", "paired")


class Click(flowkit.Record):
    user: str
    t: int  # ms


def kinds_app(store: str, standby_replicas: int = 1) -> tuple[flowkit.App, Any, Any]:
    """An app with one table of each windowed kind and a join, fed by ``clicks``."""
    app = flowkit.App("kinds", partitions=2, store=store, standby_replicas=standby_replicas)
    clicks = app.topic("clicks", value_type=Click)
    views = app.topic("views", value_type=Click)
    windows = app.table("per-window", default=int).tumbling(
        10.0, grace=0, time=lambda c: c.t, idle_timeout=None
    )
    sessions = app.table("sessions", default=int).session(
        3.0, grace=0, combine=operator.add, time=lambda c: c.t, idle_timeout=None
    )
    recent = app.table("recent", default=int).sliding(
        4.0, grace=0, combine=operator.add, time=lambda c: c.t, idle_timeout=None
    )
    paired = app.join(clicks, views, within=5.0, how="outer", name="paired")

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            windows[click.user] += 1
            sessions.add(click.user, 1)
            recent.add(click.user, 1)

    @app.agent(paired)
    async def pair(stream: flowkit.Stream[flowkit.Joined]) -> None:
        async for _ in stream:
            pass

    return app, clicks, views


@pytest.fixture(scope="module")
def changelogs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[Message]]]:
    """Per table kind, per partition: the changelog a worker on ``rocksdb://`` wrote,
    closing windows two keys a step."""
    chunk = DiskOwners.close_chunk
    DiskOwners.close_chunk = 2
    try:
        return asyncio.run(_write_changelogs(tmp_path_factory.mktemp("writer")))
    finally:
        DiskOwners.close_chunk = chunk


async def _write_changelogs(data_dir: Path) -> dict[str, list[list[Message]]]:
    app, clicks, views = kinds_app("rocksdb://", standby_replicas=0)
    broker = MemoryBroker()
    users = [f"u{i}" for i in range(12)]
    async with TestDriver(app, broker=broker, data_dir=data_dir) as driver:
        t = 0
        for step in range(30):
            for i, user in enumerate(users):
                if (step + i) % 3:  # gaps: sessions end, windows close part empty
                    t += 97 + 31 * (i % 4)
                    click = Click(user, t)
                    await driver.send(clicks, click, key=user, timestamp_ms=t)
                    if i % 2:
                        await driver.send(views, click, key=user, timestamp_ms=t)
            await driver.run_until_idle()
            await driver.advance(0.5)  # checkpoints: closes go a step at a time
        out = {}
        for name in KINDS:
            messages = await driver.messages(app.tables[name].changelog_topic)
            by_partition: list[list[Message]] = [[], []]
            for m in messages:
                by_partition[m.partition].append(m)
            out[name] = by_partition
    return out


def test_the_changelogs_cut_windows_closing_in_steps(
    changelogs: dict[str, list[list[Message]]],
) -> None:
    # Where a cut falls in a close in steps is what the copy must carry over (kind "k").
    steps = [m for p in changelogs["per-window"] for m in p if m.key == b'["k"]']
    assert steps
    assert all(len(changelogs[name][1]) > 50 for name in KINDS)


FORGED = [(None, b"1"), (b"not json", b"1"), (b'["p",1]', b"x"), (b'["Z",1,2]', None)]

cuts = st.fixed_dictionaries(
    {
        name: st.tuples(
            st.floats(0.0, 1.0),  # where the copy stops reading
            st.integers(1, 4),  # in how many pieces it reads up to there
            st.lists(
                st.tuples(st.floats(0.0, 1.0), st.sampled_from(FORGED)), min_size=1, max_size=2
            ),
        )
        for name in KINDS
    }
)


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
def test_a_copy_taken_over_then_fed_the_rest_is_a_full_replay(
    store: str,
    changelogs: dict[str, list[list[Message]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(standby, "_POLL", 0.01)  # the copy reads each piece sooner
    n = [0]

    @settings(
        max_examples=int(os.environ.get("FLOWKIT_STANDBY_EXAMPLES", "3")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cut=cuts)
    def check(cut: dict[str, tuple[float, int, list[tuple[float, Any]]]]) -> None:
        n[0] += 1
        asyncio.run(_takeover_equals_replay(store, changelogs, cut, tmp_path / str(n[0])))

    check()


async def _takeover_equals_replay(
    store: str,
    changelogs: dict[str, list[list[Message]]],
    cut: dict[str, tuple[float, int, list[tuple[float, Any]]]],
    tmp: Path,
) -> None:
    app, _, _ = kinds_app(store)
    transport = MemoryTransport()
    await transport.create_topics(required_topics(app))
    log = transport.broker
    # Partition 1 of each: a prefix (in pieces), forged records among it, then the gap.
    pieces: list[list[tuple[str, bytes | None, bytes | None]]] = [[] for _ in range(4)]
    gap: list[tuple[str, bytes | None, bytes | None]] = []
    splits: list[int] = []
    for name in KINDS:
        topic = app.tables[name].changelog_topic
        for m in changelogs[name][0]:
            log.append(topic, m.value, key=m.key, partition=0)
        records: list[tuple[bytes | None, bytes | None]] = [
            (m.key, m.value) for m in changelogs[name][1]
        ]
        where, parts, forged = cut[name]
        split = int(where * len(records))
        for at, (key, value) in forged:  # among what the copy reads (the gap: at 1.0)
            records.insert(int(at * split), (key, value))
            split += at < 1.0
        splits.append(split)
        for i, (key, value) in enumerate(records[:split]):
            pieces[i * parts // max(split, 1)].append((topic, key, value))
        gap.extend((topic, key, value) for key, value in records[split:])

    letters: list[tuple[str, bytes | None]] = []

    async def send(topic: str, value: bytes | None, **more: Any) -> None:
        letters.append((topic, value))

    taker = StateKeeper(app, transport, FakeClock(), send, data_dir=tmp / "taker")
    await taker.recover({0})  # owns partition 0, stands by for 1
    follower = asyncio.create_task(taker.standbys.run())
    try:
        for piece in pieces:
            for topic, key, value in piece:
                log.append(topic, value, key=key, partition=1)
            await _caught_up(taker)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    for topic, key, value in gap:
        log.append(topic, value, key=key, partition=1)
    read, warm = taker.recovery.done, taker.recovery.from_standby
    await taker.recover({1})
    # Taken warm: every copy that read anything (one on disk that read nothing has no
    # stamp, and is none); and only the gap replays.
    read_some = sum(1 for split in splits if split)
    assert read_some <= taker.recovery.from_standby - warm <= len(KINDS)
    assert taker.recovery.done - read == len(gap)

    replayed: list[tuple[str, bytes | None]] = []

    async def send_replayed(topic: str, value: bytes | None, **more: Any) -> None:
        replayed.append((topic, value))

    whole = StateKeeper(app, transport, FakeClock(), send_replayed, data_dir=tmp / "whole")
    await whole.recover({0, 1})
    assert sorted(letters, key=repr) == sorted(replayed, key=repr)
    assert taker.closing() == whole.closing()
    for name in KINDS:
        table = app.tables[name]
        mine, theirs = taker.stores[table], whole.stores[table]
        assert state_of(mine, 1) == state_of(theirs, 1), name
    taker.aclose(clean=False)
    whole.aclose(clean=False)
    for name in KINDS:
        table = app.tables[name]
        if isinstance(taker.stores[table], OnDisk):
            assert on_disk(taker.stores[table], 1) == on_disk(whole.stores[table], 1), name


async def _caught_up(state: StateKeeper, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    await asyncio.sleep(0)
    while state.standbys.lag() != 0:
        assert time.monotonic() < end, f"standby lag {state.standbys.lag()}"
        await asyncio.sleep(0.005)


def state_of(store: Any, p: int) -> Any:
    """What ``store`` holds of partition ``p`` in memory, as plain data: both stages of a
    windowed table, a join's buffers; with the changelog records it refused."""
    held: list[Any] = [p in store.held()]
    if hasattr(store, "owners"):
        held += [dump(store.parts[p]), dump(store.owners.owners[p])]
    else:
        held.append(dump(store.parts[p]))
    held.append(sorted(m.offset for m, _ in store.rejected if m.partition == p))
    return held


_SKIPPED = {"db", "disk", "rocksdict", "unflushed", "cursors", "active"}


def dump(obj: Any, name: str = "") -> Any:
    """``obj`` as plain data; heaps ordered by a counter as the sorted entries without
    it (two stores' counters differ, their order of one time does not)."""
    if isinstance(obj, int | float | str | bytes | bool | type(None)):
        return obj
    if name in ("closing", "expiring") and isinstance(obj, list):
        return sorted(((e[0], *e[2:]) for e in obj), key=repr)
    if isinstance(obj, dict):
        return {repr(k): dump(v) for k, v in obj.items()}
    if isinstance(obj, set | frozenset):
        return sorted(repr(v) for v in obj)
    if isinstance(obj, list | tuple | collections.deque):
        return [dump(v) for v in obj]
    if type(obj).__module__.startswith("rocksdict"):
        return None
    slots = [s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())]
    fields = dict(getattr(obj, "__dict__", {})) | {s: getattr(obj, s, None) for s in slots}
    return {k: dump(v, k) for k, v in sorted(fields.items()) if k not in _SKIPPED}


def on_disk(store: Any, p: int) -> dict[bytes, bytes]:
    """Partition ``p``'s database (closed), key by key."""
    db = open_db(open_rocksdict(), store.path(p))
    try:
        return dict(db.items())
    finally:
        db.close()
