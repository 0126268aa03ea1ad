"""Standby replicas over a kill -9 on the test broker: the surviving worker, which kept
warm copies of the killed owner's table partitions, takes them over replaying only the
changelog its copies had not read (the gap), and the counts stay exact; for a table in
memory, one in RocksDB (its copies are databases in the survivor's data directory) and a
tumbling windowed table (its open windows' partials and its owners' state taken warm:
every window closed after the kill counts exactly)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import aiohttp
import msgspec
import pytest

from flowkit.partitioning import partition_for_key
from flowkit.transports import OutRecord
from flowkit.windows import WindowResult
from tests.kafka.conftest import (
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    WorkerProcess,
    broker_url,
    latest_by_key,
    until,
)
from tests.local_servers import free_port

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.standby_app:app"
GROUP = "tally"
KEYS_TOPIC = "tally-keys"
CHANGELOGS = ["tally-counts-changelog", "tally-disk-changelog"]
TABLES = 3  # with the windowed table
PARTITIONS = 4
KEYS = 20_000
RECOVERED = re.compile(
    r"tables recovered +from_local_state=(\d+) from_standby=(\d+) partitions=\[([^\]]*)\] "
    r"records=(\d+)"
)


async def produce(client: Client, first: int, count: int) -> dict[int, int]:
    """Keys ``k<first>`` .. as records keyed by themselves, a batch per partition; the
    offset after the last, per partition."""
    batches: dict[int, list[OutRecord]] = {p: [] for p in range(PARTITIONS)}
    for i in range(first, first + count):
        key = b"k%d" % i
        batches[partition_for_key(key, PARTITIONS)].append((key, key, (), None))
    producer = client.transport.producer(client_id="test-producer")
    await producer.start()
    try:
        ends = {}
        for p, batch in batches.items():
            acks = await producer.send_batch(KEYS_TOPIC, p, batch)
            ends[p] = (await acks[-1][1]).offset + 1
        return ends
    finally:
        await producer.aclose()


async def copies_caught_up(url: str, deadline: float) -> None:
    """Until the worker's /status says its copies (2 partitions of 3 tables) read all."""
    end = time.monotonic() + deadline
    async with aiohttp.ClientSession() as http:
        standby = None
        while True:
            try:
                async with http.get(url) as response:
                    standby = (await response.json())["standby"]
            except aiohttp.ClientConnectionError:
                pass  # not listening yet
            if standby == {"partitions": 2 * TABLES, "lag": 0}:
                return
            assert time.monotonic() < end, f"standby copies not caught up: {standby}"
            await asyncio.sleep(0.1)


# The workers' client: aiokafka, or both with FLOWKIT_TEST_ALL_CLIENTS=1 (the standby's
# consumer is assigned partitions by hand and seeks: each client's own code).
CLIENTS = (
    ["aiokafka", "rdkafka"]
    if os.environ.get("FLOWKIT_TEST_ALL_CLIENTS", "") not in ("", "0")
    else ["aiokafka"]
)


@ON_TANSU
@pytest.mark.parametrize("kafka_client", CLIENTS)
async def test_a_standby_takes_over_a_killed_owner_replaying_only_the_gap(
    kafka_server: KafkaServer,
    client: Client,
    workers: Spawn,
    kafka_client: str,
    tmp_path: Path,
) -> None:
    url = broker_url(kafka_server.bootstrap, client=kafka_client)

    port = free_port()

    def start(name: str, *more: str) -> WorkerProcess:
        data = ["--data-dir", str(tmp_path / name)]  # a machine each
        return workers(name, "worker", APP, "--broker", url, "-l", "info", *data, *more)

    # Each owns half the partitions and keeps a copy of the other half.
    owner, standby = start("owner"), start("standby", "--web-port", str(port))

    def sharing() -> bool:
        return all(
            w.assigned()
            and len({a for a in w.assigned()[-1] if a.startswith(KEYS_TOPIC)}) == 2
            and len(RECOVERED.findall(w.err)) == len(w.assigned())
            for w in (owner, standby)
        )

    await until(sharing, 60, "two workers sharing the partitions")
    ends = await produce(client, 0, KEYS)
    await client.wait_committed(GROUP, KEYS_TOPIC, ends, deadline=60)
    await copies_caught_up(f"http://127.0.0.1:{port}/status", deadline=60)
    owner.kill()
    before = len(RECOVERED.findall(standby.err))

    def took_over() -> re.Match[str] | None:
        found = list(RECOVERED.finditer(standby.err))
        return found[-1] if len(found) > before else None

    await until(lambda: took_over() is not None or not standby.running(), 60, "a takeover")
    line = took_over()
    assert line is not None, standby.err
    from_local, from_standby = int(line[1]), int(line[2])
    partitions, replayed = line[3].split(","), int(line[4])
    # Every partition taken came warm, and only the gap replays: what the copies had not
    # read when the group moved the partitions (nothing, normally: the killed owner was
    # idle, and the copies read on until the takeover). Without copies, the whole
    # changelog of the killed owner's partitions, about KEYS / 2 records, would replay.
    # Every table counts per partition; a rocksdb:// partition this worker owned before
    # the rebalance comes from its own local state, as far as its copy (two tables).
    assert from_local + from_standby == TABLES * len(partitions), line[0]
    assert from_standby >= 2 * TABLES and from_local <= 4, line[0]
    assert replayed < KEYS // 10, line[0]

    more = await produce(client, KEYS - 100, 200)  # 100 keys again, 100 new ones
    await client.wait_committed(GROUP, KEYS_TOPIC, more, deadline=60)
    assert await standby.stop() == 0, standby.err

    want = {b"k%d" % i: b"1" for i in range(KEYS + 100)}
    want |= {b"k%d" % i: b"2" for i in range(KEYS - 100, KEYS)}
    for changelog in CHANGELOGS:
        table = latest_by_key(await client.read(changelog, PARTITIONS))
        assert table == want, (changelog, sum(1 for k in want if table.get(k) != want[k]))
    # Every window of a second up to k19999 closed (k20000.. opened the next), each key
    # counted once, the 100 sent again twice: those open at the kill were taken warm.
    results: dict[tuple[str, int], int] = {}
    for m in await client.read("tally-windows", PARTITIONS):
        result = msgspec.json.decode(m.value or b"", type=WindowResult)
        results[(str(result.key), result.start)] = int(str(result.value))
    closed = {(f"k{i}", i // 1000 * 1000): 1 for i in range(KEYS)}
    closed |= {(f"k{i}", i // 1000 * 1000): 2 for i in range(KEYS - 100, KEYS)}
    assert results == closed, sum(1 for k in closed if results.get(k) != closed[k])
