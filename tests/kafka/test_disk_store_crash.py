"""The ``rocksdb://`` store over a kill -9 on the test broker: the restarted worker opens
the local state the killed one left (written at its last checkpoint), replays only the
changelog after it, and nothing is lost or counted more than at-least-once allows."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.kafka.conftest import (
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    WorkerProcess,
    broker_url,
    end_offsets,
)
from tests.kafka.disk_crash import CLIENTS, assert_from_local_state, start_on_disk
from tests.kafka.test_processes import (
    COUNTS_GROUP,
    ITEMS,
    PARTITIONS,
    assert_clean,
    items,
    seen_by_seq,
)

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.counts_disk_app:app"


@ON_TANSU
@pytest.mark.parametrize("kafka_client", CLIENTS)
async def test_sigkill_then_restart_from_local_state_on_disk(
    kafka_server: KafkaServer, client: Client, workers: Spawn, tmp_path: Path, kafka_client: str
) -> None:
    url = broker_url(kafka_server.bootstrap, client=kafka_client)
    data = str(tmp_path / "data")

    def start(name: str) -> WorkerProcess:
        return start_on_disk(workers, name, APP, url, data)

    first = start("disk-1")
    await first.wait_for_log("tables recovered", deadline=60)
    total = 1_200
    acks = await client.produce(ITEMS, items(0, total))
    where = {seq: (ack.partition, ack.offset) for seq, ack in enumerate(acks)}
    ends = end_offsets(acks, PARTITIONS)
    deadline = time.monotonic() + 60
    while sum((await client.committed(COUNTS_GROUP, ITEMS, PARTITIONS)).values()) < 300:
        assert time.monotonic() < deadline, f"nothing committed in 60 s:\n{first.err}"
        assert first.running(), first.err
        await asyncio.sleep(0.05)
    first.kill()
    committed = await client.committed(COUNTS_GROUP, ITEMS, PARTITIONS)

    second = start("disk-2")
    await client.wait_committed(COUNTS_GROUP, ITEMS, ends, deadline=120)
    assert await second.stop() == 0, second.err

    seen = await seen_by_seq(client)
    assert set(seen) == set(range(total)), sorted(set(range(total)) - set(seen))[:20]
    for seq, count in seen.items():
        partition, offset = where[seq]
        assert count == 1 if offset < committed[partition] else count in (1, 2), seq
    await assert_from_local_state(client, second.err, "counts-seen-changelog", PARTITIONS)
    assert_clean(second.err)
