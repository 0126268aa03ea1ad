"""A worker process with open sessions on ``rocksdb://`` is killed with SIGKILL on the test
broker; a second one opens the databases the first left and replays only the changelog's
tail. On both clients (the workers': the test's own is aiokafka): this is the kill -9 on
disk with the most paths that differ between them (the repartition topic, the changelog's
tail, window results and the marker before them, the commits). The checks are the memory
store's (test_session_crash.py): every session once with its exact bounds, twice only as
a marked replay, its sum exact but for the at-least-once replay, and at the end the
changelog holds no session of any user.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.kafka.apps.sessions_disk_app import PARTITIONS
from tests.kafka.conftest import ON_TANSU, Client, KafkaServer, Spawn, broker_url
from tests.kafka.disk_crash import DISK_CLIENTS, assert_from_local_state
from tests.kafka.test_session_crash import bridges, data_set, sessions
from tests.kafka.window_crash import Run

pytestmark = pytest.mark.kafka

CHANGELOG = "sessdiskcrash-visits-changelog"

RUN = Run(
    "tests.kafka.apps.sessions_disk_app:app",
    "sessdiskcrash",
    "sd-hits",
    "sd-out",
    CHANGELOG,
    PARTITIONS,
    open_kinds=(b'["S",', b'["O",'),
    key_kinds=(b'["S",', b'["O",', b'["C",'),
)


@ON_TANSU
@pytest.mark.parametrize("kafka_client", DISK_CLIENTS)
async def test_sigkill_with_open_sessions_on_disk_then_every_session_once_from_the_tail(
    kafka_server: KafkaServer, client: Client, workers: Spawn, tmp_path: Path, kafka_client: str
) -> None:
    hits = data_set(int(time.time() * 1000) - 7_200_000)
    expected = {w: v for w, v in sessions(hits).items() if w[0].startswith("u")}
    assert bridges(hits) > 0  # the data merges sessions
    url = broker_url(kafka_server.bootstrap, client=kafka_client)
    out, again, committed = await RUN.kill_and_restart(
        client, workers, url, hits, set(expected), data_dir=str(tmp_path / "data")
    )
    await RUN.check(client, out, expected, hits, again, committed)
    await assert_from_local_state(client, RUN.second_err, CHANGELOG, PARTITIONS)
