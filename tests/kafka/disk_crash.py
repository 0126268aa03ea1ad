"""What the kill -9 tests of stores on ``rocksdb://`` share (test_disk_store_crash.py,
test_session_disk_crash.py, test_tumbling_disk_crash.py, the disk variant of
test_join_crash.py): starting a worker on a data directory, with either client, and the
check that a restarted worker came back from its local databases, replaying only the
changelog's tail.

The workers' client is aiokafka by default; each test that takes ``DISK_CLIENTS`` runs on
librdkafka too (its consumer, producer and positions take other paths through recovery,
the changelog's tail and the commits).
"""

from __future__ import annotations

import os
import re

from tests.kafka.conftest import Client, Spawn, WorkerProcess

# Both clients for the test that takes them; FLOWKIT_TEST_ALL_CLIENTS=1 for every test.
ALL_CLIENTS = os.environ.get("FLOWKIT_TEST_ALL_CLIENTS", "") not in ("", "0")
DISK_CLIENTS = ["aiokafka", "rdkafka"]
CLIENTS = DISK_CLIENTS if ALL_CLIENTS else ["aiokafka"]

RECOVERED = re.compile(r"tables recovered.* from_local_state=(\d+).* records=(\d+)")


def start_on_disk(
    workers: Spawn, name: str, app: str, url: str, data_dir: str, *options: str
) -> WorkerProcess:
    """A ``flowkit worker`` of ``app`` on ``url``, its local state in ``data_dir``."""
    return workers(
        name, "worker", app, "--broker", url, "--data-dir", data_dir, "-l", "info", *options
    )


async def assert_from_local_state(
    client: Client, err: str, changelog: str, partitions: int
) -> None:
    """Every partition came back from its database (the second worker's log ``err``
    says so), with at most what the killed worker wrote to the changelog after its last
    local write to replay: less than half the changelog."""
    line = RECOVERED.search(err)
    assert line is not None, err
    assert int(line[1]) == partitions, line[0]
    changelog_records = len(await client.read(changelog, partitions))
    assert int(line[2]) < changelog_records / 2, (line[0], changelog_records)
