"""A worker process with open tumbling windows on ``rocksdb://`` is killed with SIGKILL on
the test broker; a second one opens the databases the first left and replays only the
changelog's tail. Every window comes out, twice only as a marked replay, none that the
hits do not define; its sum is exact but for the at-least-once replay (a hit after the
last commit may count twice in a window still open at the kill); and at the end the
changelog holds no record of any user.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.kafka.apps.tumbling_disk_app import PARTITIONS, SIZE
from tests.kafka.conftest import ON_TANSU, Client, KafkaServer, Spawn, broker_url
from tests.kafka.disk_crash import CLIENTS, assert_from_local_state
from tests.kafka.test_sliding_crash import data_set
from tests.kafka.window_crash import Hit, Run

pytestmark = pytest.mark.kafka

CHANGELOG = "tumblecrash-sums-changelog"
SIZE_MS = int(SIZE * 1000)

RUN = Run(
    "tests.kafka.apps.tumbling_disk_app:app",
    "tumblecrash",
    "tu-hits",
    "tu-out",
    CHANGELOG,
    PARTITIONS,
    open_kinds=(b'["p",', b'["o",'),  # open windows' partials, at the source or the owner
    key_kinds=(b'["p",', b'["o",', b'["c",'),
)


def windows(hits: list[Hit]) -> dict[tuple[str, int, int], list[int]]:
    """``(user, start, end)`` -> the indexes of its hits (none is late: see data_set)."""
    out: dict[tuple[str, int, int], list[int]] = {}
    for i, (user, t, _) in enumerate(hits):
        start = t - t % SIZE_MS
        out.setdefault((user, start, start + SIZE_MS), []).append(i)
    return out


@ON_TANSU
@pytest.mark.parametrize("kafka_client", CLIENTS)
async def test_sigkill_with_open_windows_on_disk_then_every_window_once_from_the_tail(
    kafka_server: KafkaServer, client: Client, workers: Spawn, tmp_path: Path, kafka_client: str
) -> None:
    hits = data_set(int(time.time() * 1000) - 7_200_000)
    expected = {w: v for w, v in windows(hits).items() if w[0].startswith("u")}
    url = broker_url(kafka_server.bootstrap, client=kafka_client)
    out, again, committed = await RUN.kill_and_restart(
        client, workers, url, hits, set(expected), data_dir=str(tmp_path / "data")
    )
    await RUN.check(client, out, expected, hits, again, committed)
    await assert_from_local_state(client, RUN.second_err, CHANGELOG, PARTITIONS)
