"""A worker process with open sessions is killed with SIGKILL on the test broker; a second
one goes on from the commits and the changelog. Every session comes out with its exact
bounds (hits that bridged two sessions merged them, across the kill too), twice only as a
marked replay, and none that was merged away or has expired: at the end the changelog
holds no session of any user. Its sum is exact but for the at-least-once replay (a hit
after the last commit may count twice in a session still open at the kill).
"""

from __future__ import annotations

import itertools
import random
import time

import pytest

from tests.kafka.apps.sessions_app import GAP, GRACE, PARTITIONS
from tests.kafka.conftest import (
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    broker_url,
)
from tests.kafka.window_crash import Hit, Run, Window, flush_hits

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.sessions_app:app"
GROUP = "sesscrash"
CHANGELOG = "sesscrash-visits-changelog"
GAP_MS = int(GAP * 1000)


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
    return [h for _, h in hits] + flush_hits(t0, PARTITIONS)


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


RUN = Run(
    APP,
    GROUP,
    "sc-hits",
    "sc-out",
    CHANGELOG,
    PARTITIONS,
    open_kinds=(b'["S",', b'["O",'),
    key_kinds=(b'["S",', b'["O",', b'["C",'),
)


@ON_TANSU
async def test_sigkill_with_open_sessions_then_every_session_once_and_nothing_left(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    hits = data_set(int(time.time() * 1000) - 7_200_000)
    expected = {w: v for w, v in sessions(hits).items() if w[0].startswith("u")}
    assert bridges(hits) > 0  # the data merges sessions
    url = broker_url(kafka_server.bootstrap)
    out, again, committed = await RUN.kill_and_restart(client, workers, url, hits, set(expected))
    # Every session once, with its final bounds: none that a merge replaced, none twice
    # but as a marked replay (the second worker closing again one the first had closed).
    await RUN.check(client, out, expected, hits, again, committed)
