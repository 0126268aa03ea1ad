"""A worker process with open sessions on ``rocksdb://`` is killed with SIGKILL on the test
broker; a second one opens the databases the first left and replays only the changelog's
tail. The checks are the memory store's (test_session_crash.py): every session once with
its exact bounds, twice only as a marked replay, its sum exact but for the at-least-once
replay, and at the end the changelog holds no session of any user.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.kafka.apps.sessions_disk_app import PARTITIONS
from tests.kafka.conftest import ON_TANSU, Client, KafkaServer, Spawn, broker_url
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
async def test_sigkill_with_open_sessions_on_disk_then_every_session_once_from_the_tail(
    kafka_server: KafkaServer, client: Client, workers: Spawn, tmp_path: Path
) -> None:
    hits = data_set(int(time.time() * 1000) - 7_200_000)
    expected = {w: v for w, v in sessions(hits).items() if w[0].startswith("u")}
    assert bridges(hits) > 0  # the data merges sessions
    url = broker_url(kafka_server.bootstrap)
    out, again, committed = await RUN.kill_and_restart(
        client, workers, url, hits, set(expected), data_dir=str(tmp_path / "data")
    )
    await RUN.check(client, out, expected, hits, again, committed)
    # Every partition came back from its database, with at most what the killed worker
    # wrote to the changelog after its last local write to replay.
    line = re.search(r"tables recovered.* from_local_state=(\d+).* records=(\d+)", RUN.second_err)
    assert line is not None, RUN.second_err
    assert int(line[1]) == PARTITIONS, line[0]
    changelog_records = len(await client.read(CHANGELOG, PARTITIONS))
    assert int(line[2]) < changelog_records / 2, (line[0], changelog_records)
