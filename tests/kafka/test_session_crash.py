"""A worker process with open sessions is killed with SIGKILL on the test broker; a second
one goes on from the commits and the changelog. Every session comes out with its exact
bounds (hits that bridged two sessions merged them, across the kill too), twice only as a
marked replay, and none that was merged away or has expired: at the end the changelog
holds no session of any user. Its sum is exact but for the at-least-once replay (a hit
after the last commit may count twice in a session still open at the kill).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter

import msgspec
import pytest

from flowkit.partitioning import partition_for_key
from flowkit.records import Message
from flowkit.transports import TopicSpec
from tests.kafka.apps.sessions_app import GAP, GRACE, PARTITIONS
from tests.kafka.conftest import (
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    broker_url,
    latest_by_key,
    start_worker,
    until,
)

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.sessions_app:app"
GROUP = "sesscrash"
CHANGELOG = "sesscrash-visits-changelog"
REPLAYED = "flowkit.replayed"
GAP_MS = int(GAP * 1000)
Hit = tuple[str, int, int]  # user, event time (ms), n
Window = tuple[str, int, int]  # user, start, end
Session = tuple[str, int, int, int]  # user, start, end, sum


def data_set(t0: int, users: int = 24, per_user: int = 25) -> list[Hit]:
    """Each user's hits in bursts (steps of 0.3 to 1.2 s, a pause of 2.5 s now and then),
    in the order they arrive: by event time plus up to 1.5 s of delay, less than the
    grace, so none is late and a delayed hit can bridge two sessions. Then a hit per
    partition an hour ahead, which closes and expires every session."""
    rng = random.Random(7)
    delay = int(GRACE * 1000) // 2  # below the grace: no hit is late
    hits: list[tuple[int, Hit]] = []
    for u in range(users):
        t = t0 + rng.randrange(0, 3000)
        for i in range(per_user):
            t += rng.choice([300, 600, 900, 1200, 2500])
            hits.append((t + rng.randrange(0, delay), (f"u{u}", t, i % 5 + 1)))
    hits.sort()
    flush: dict[int, Hit] = {}
    for i in range(1000):
        p = partition_for_key(f"f{i}".encode(), PARTITIONS)
        flush.setdefault(p, (f"f{i}", t0 + 3_600_000, 1))
    return [h for _, h in hits] + list(flush.values())


def sessions(hits: list[Hit]) -> dict[Window, list[int]]:
    """The sessions by their definition, ``(user, start, end)`` -> the indexes of their
    hits: each user's hits within ``gap`` of each other, bounds included (no hit is late,
    so the order they came in does not matter)."""
    by_user: dict[str, list[tuple[int, int]]] = {}
    for i, (user, t, _) in enumerate(hits):
        by_user.setdefault(user, []).append((t, i))
    out: dict[Window, list[int]] = {}
    for user, times in by_user.items():
        times.sort()
        members = [times[0][1]]
        start = end = times[0][0]
        for t, i in times[1:]:
            if t - end > GAP_MS:
                out[user, start, end] = members
                start, members = t, []
            end = t
            members.append(i)
        out[user, start, end] = members
    return out


def result(m: Message) -> Session:
    r = msgspec.json.decode(m.value or b"{}")
    return (r["key"], r["start"], r["end"], r["value"])


def bridges(hits: list[Hit]) -> int:
    """Hits that, in the order they came, joined two sessions of their user into one."""
    seen: dict[str, list[int]] = {}
    merged = 0
    for user, t, _ in hits:
        times = seen.setdefault(user, [])
        before = sorted(times)
        if any(
            a < t < b and b - a > GAP_MS and t - a <= GAP_MS and b - t <= GAP_MS
            for a, b in itertools.pairwise(before)
        ):
            merged += 1
        times.append(t)
    return merged


@ON_TANSU
async def test_sigkill_with_open_sessions_then_every_session_once_and_nothing_left(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    url = broker_url(kafka_server.bootstrap)
    t0 = int(time.time() * 1000) - 7_200_000
    hits = data_set(t0)
    expected = {w: v for w, v in sessions(hits).items() if w[0].startswith("u")}
    assert bridges(hits) > 0  # the data merges sessions
    await client.transport.create_topics([TopicSpec("sc-hits", PARTITIONS)])
    encode = msgspec.json.encode
    acks = await client.produce(
        "sc-hits",
        [(u.encode(), encode({"user": u, "t": t, "n": n}), t) for u, t, n in hits],
    )

    first = start_worker(workers, "sessions-1", APP, url)
    committed: dict[int, int] = {}

    async def progress() -> None:
        committed.update(await client.committed(GROUP, "sc-hits", PARTITIONS))

    deadline = time.monotonic() + 30
    while sum(committed.values()) < len(hits) // 4:
        assert time.monotonic() < deadline, f"too little committed in 30 s:\n{first.err}"
        assert first.running(), first.err
        await progress()
        await asyncio.sleep(0.05)
    first.kill()
    assert first.popen.returncode == -9
    await progress()
    assert sum(committed.values()) < len(hits) - PARTITIONS, committed  # killed mid-run
    # Sessions were open when it died: the changelog holds some.
    held = latest_by_key(await client.read(CHANGELOG, PARTITIONS))
    assert any(k[:5] in (b'["S",', b'["O",') and v for k, v in held.items()), held
    # The hits after the last commit are read again: at-least-once, those whose effect
    # reached the changelog count twice in a session still open then.
    again = {i for i, a in enumerate(acks) if a.offset >= committed[a.partition]}

    # Until every session is out (the hits an hour ahead close them all), then a stop.
    second = start_worker(workers, "sessions-2", APP, url)
    deadline = time.monotonic() + 60
    while not set(expected) <= {result(m)[:3] for m in await client.read("sc-out", PARTITIONS)}:
        if time.monotonic() > deadline or not second.running():
            break  # the comparison below says what is missing
        await asyncio.sleep(0.2)
    await until(lambda: "tables recovered" in second.err, 10, "the second worker's recovery")
    assert await second.stop() == 0, second.err

    out = [m for m in await client.read("sc-out", PARTITIONS) if m.value]
    counted = Counter(result(m) for m in out)
    windows = Counter(s[:3] for s in counted.elements())
    # Every session once, with its final bounds: none that a merge replaced, none twice
    # but as a marked replay (the second worker closing again one the first had closed).
    assert set(windows) == set(expected), (
        sorted(set(expected) - set(windows))[:10],
        sorted(set(windows) - set(expected))[:10],
    )
    replayed = {result(m) for m in out if (REPLAYED, b"true") in m.headers}
    assert all(n == 1 or (n == 2 and s in replayed) for s, n in counted.items()), counted
    for user, start, end, value in counted:
        members = expected[user, start, end]
        exact = sum(hits[i][2] for i in members)
        twice = sum(hits[i][2] for i in members if i in again)
        assert exact <= value <= exact + twice, (user, start, end, value, exact, twice)
    # A hit read again whose session had closed since is late: dead-lettered, nothing else.
    for letter in await client.read("sesscrash-dlq", 1):
        headers = dict(letter.headers)
        assert headers["flowkit.error.type"] == b"LateRecord", headers
        p, offset = int(headers["flowkit.source.partition"]), int(headers["flowkit.source.offset"])
        assert offset >= committed[p], headers
    # Closed, merged and expired sessions are gone from the changelog: nothing of a user.
    left = latest_by_key(await client.read(CHANGELOG, PARTITIONS))
    kept = [k for k, v in left.items() if v and k[:5] in (b'["S",', b'["O",', b'["C",')]
    assert all(b'"f' in k for k in kept), kept  # only the hits an hour ahead stay open
