"""A worker process with open sliding windows is killed with SIGKILL on the test broker; a
second one goes on from the commits and the changelog. Every window Kafka Streams'
``SlidingWindows`` defines comes out (the plain reference of tests/test_sliding.py says
which), twice only as a marked replay, none that it does not define; its sum is exact
but for the at-least-once replay (a hit after the last commit may count twice in a
window still open at the kill); and at the end the changelog holds no record of any user.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import msgspec
import pytest

from flowkit.partitioning import partition_for_key
from flowkit.records import Message
from flowkit.transports import TopicSpec
from tests.kafka.apps.sliding_app import GRACE, PARTITIONS, SIZE
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
from tests.test_sliding import reference

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.sliding_app:app"
GROUP = "slidecrash"
CHANGELOG = "slidecrash-recent-changelog"
REPLAYED = "flowkit.replayed"
SIZE_MS = int(SIZE * 1000)
Hit = tuple[str, int, int]  # user, event time (ms), n
Result = tuple[str, int, int, int]  # user, start, end, sum


def data_set(t0: int, users: int = 16, per_user: int = 25) -> list[Hit]:
    """Each user's hits 0.3 to 2.5 s apart, in the order they arrive: by event time plus
    up to 1.5 s of delay, less than the grace, so none is late. Then a hit per partition
    an hour ahead, which closes and expires every window."""
    rng = random.Random(11)
    delay = int(GRACE * 1000) // 2
    hits: list[tuple[int, Hit]] = []
    for u in range(users):
        t = t0 + rng.randrange(0, 3000)
        for i in range(per_user):
            t += rng.choice([300, 700, 1100, 2500])
            hits.append((t + rng.randrange(0, delay), (f"u{u}", t, i % 5 + 1)))
    hits.sort()
    flush: dict[int, Hit] = {}
    for i in range(1000):
        p = partition_for_key(f"f{i}".encode(), PARTITIONS)
        flush.setdefault(p, (f"f{i}", t0 + 3_600_000, 1))
    return [h for _, h in hits] + list(flush.values())


def windows(hits: list[Hit]) -> dict[tuple[str, int, int], list[int]]:
    """The windows by the reference, per partition in the order the hits came, ``(user,
    start, end)`` -> the indexes of their hits."""
    out: dict[tuple[str, int, int], list[int]] = {}
    for p in range(PARTITIONS):
        mine = [i for i, h in enumerate(hits) if partition_for_key(h[0].encode(), PARTITIONS) == p]
        closed, late = reference(
            [(hits[i][0], hits[i][1], [i]) for i in mine], SIZE_MS, int(GRACE * 1000)
        )
        assert late == []
        for user, start, end, members in closed:
            out[user, start, end] = members
    return out


def result(m: Message) -> Result:
    r = msgspec.json.decode(m.value or b"{}")
    return (r["key"], r["start"], r["end"], r["value"])


@ON_TANSU
async def test_sigkill_with_open_sliding_windows_then_every_window_once_and_nothing_left(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    url = broker_url(kafka_server.bootstrap)
    t0 = int(time.time() * 1000) - 7_200_000
    hits = data_set(t0)
    expected = {w: v for w, v in windows(hits).items() if w[0].startswith("u")}
    await client.transport.create_topics([TopicSpec("sl-hits", PARTITIONS)])
    encode = msgspec.json.encode
    acks = await client.produce(
        "sl-hits",
        [(u.encode(), encode({"user": u, "t": t, "n": n}), t) for u, t, n in hits],
    )

    first = start_worker(workers, "sliding-1", APP, url)
    committed: dict[int, int] = {}

    async def progress() -> None:
        committed.update(await client.committed(GROUP, "sl-hits", PARTITIONS))

    async def windows_open() -> bool:  # the owner keeps records of open windows
        held = latest_by_key(await client.read(CHANGELOG, PARTITIONS))
        return any(k[:5] == b'["R",' and v for k, v in held.items())

    deadline = time.monotonic() + 30
    while sum(committed.values()) < len(hits) // 4 or not await windows_open():
        assert time.monotonic() < deadline, f"too little done in 30 s:\n{first.err}"
        assert first.running(), first.err
        await progress()
        await asyncio.sleep(0.05)
    first.kill()
    assert first.popen.returncode == -9
    await progress()
    assert sum(committed.values()) < len(hits) - PARTITIONS, committed  # killed mid-run
    # The hits after the last commit are read again: at-least-once, those whose effect
    # reached the changelog count twice in a window still open then.
    again = {i for i, a in enumerate(acks) if a.offset >= committed[a.partition]}

    second = start_worker(workers, "sliding-2", APP, url)
    deadline = time.monotonic() + 60
    while not set(expected) <= {result(m)[:3] for m in await client.read("sl-out", PARTITIONS)}:
        if time.monotonic() > deadline or not second.running():
            break  # the comparison below says what is missing
        await asyncio.sleep(0.2)
    await until(lambda: "tables recovered" in second.err, 10, "the second worker's recovery")
    assert await second.stop() == 0, second.err

    out = [m for m in await client.read("sl-out", PARTITIONS) if m.value]
    counted = Counter(result(m) for m in out)
    seen = Counter(r[:3] for r in counted.elements())
    assert set(seen) == set(expected), (
        sorted(set(expected) - set(seen))[:10],
        sorted(set(seen) - set(expected))[:10],
    )
    replayed = {result(m) for m in out if (REPLAYED, b"true") in m.headers}
    assert all(n == 1 or (n == 2 and r in replayed) for r, n in counted.items()), counted
    for user, start, end, value in counted:
        members = expected[user, start, end]
        exact = sum(hits[i][2] for i in members)
        twice = sum(hits[i][2] for i in members if i in again)
        assert exact <= value <= exact + twice, (user, start, end, value, exact, twice)
    # A hit read again whose windows had closed since is late: dead-lettered, nothing else.
    for letter in await client.read("slidecrash-dlq", 1):
        headers = dict(letter.headers)
        assert headers["flowkit.error.type"] == b"LateRecord", headers
        p, offset = int(headers["flowkit.source.partition"]), int(headers["flowkit.source.offset"])
        assert offset >= committed[p], headers
    # Every user's records are gone from the changelog once their windows expired.
    left = latest_by_key(await client.read(CHANGELOG, PARTITIONS))
    kept = [k for k, v in left.items() if v and k[:5] == b'["R",']
    assert all(b'"f' in k for k in kept), kept  # only the hits an hour ahead stay
