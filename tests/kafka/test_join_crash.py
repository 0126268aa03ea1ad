"""A worker process running a stream-stream join is killed with SIGKILL mid-run on Kafka;
a second one restarts from the commits and the changelog. The output is checked against
the join computed by its definition: every result there (nothing lost), nothing else, and
a result twice only if docs/concepts/joins.md says a replay may repeat it. With the join's
buffers on ``rocksdb://`` (on the test broker), the second worker opens the databases the
killed one left and replays only the changelog after them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from flowkit.partitioning import partition_for_key
from flowkit.transports import Ack, TopicSpec
from tests.kafka.apps.join_app import GRACE, PARTITIONS, WITHIN
from tests.kafka.conftest import (
    ON_APACHE_KAFKA,
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    WorkerProcess,
    broker_url,
    end_offsets,
)
from tests.kafka.disk_crash import CLIENTS, assert_from_local_state

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.join_app:app"
DISK_APP = "tests.kafka.apps.join_disk_app:app"
GROUP = "joincrash"
CHANGELOG = "joincrash-paid-changelog"
WITHIN_MS, CLOSE_MS = int(WITHIN * 1000), int((WITHIN + GRACE) * 1000)
T0 = 1_700_000_000_000
Rec = tuple[str, str, str, int]  # (topic, key, id, timestamp)


def data_set(count: int = 1_600) -> list[Rec]:
    """Orders and payments on 40 keys, 100 ms apart, each key every 4 s (neighbours of a
    key match, the ones after them do not), then one order per partition far ahead, so
    that stream time closes every window."""
    rng = random.Random(11)
    recs: list[Rec] = []
    for n in range(count):
        topic = "jc-orders" if rng.random() < 0.5 else "jc-payments"
        recs.append((topic, f"k{n % 40}", f"{topic[3]}{n}", T0 + n * 100))
    flush: dict[int, Rec] = {}
    for i in range(1000):
        p = partition_for_key(f"f{i}".encode(), PARTITIONS)
        if p not in flush:
            flush[p] = ("jc-orders", f"f{i}", f"flush{p}", T0 + count * 100 + 600_000)
    return recs + list(flush.values())


def truth(records: list[Rec]) -> set[str]:
    """The outer join by its definition (the flush orders' windows never close)."""
    orders = [r for r in records if r[0] == "jc-orders"]
    payments = [r for r in records if r[0] == "jc-payments"]
    out = {
        f"{o[1]}:{o[2]}:{p[2]}"
        for o in orders
        for p in payments
        if o[1] == p[1] and abs(o[3] - p[3]) <= WITHIN_MS
    }
    paired = {x for r in out for x in r.split(":")[1:]}
    out |= {f"{o[1]}:{o[2]}:-" for o in orders if o[2] not in paired and "flush" not in o[2]}
    out |= {f"{p[1]}:-:{p[2]}" for p in payments if p[2] not in paired}
    return out


@ON_APACHE_KAFKA
async def test_sigkill_mid_join_loses_no_result_and_repeats_only_replayed_ones(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    await crash_and_restart(kafka_server, client, workers, APP)


@ON_TANSU
@pytest.mark.parametrize("kafka_client", CLIENTS)
async def test_sigkill_mid_join_on_rocksdb_restarts_from_local_state(
    kafka_server: KafkaServer, client: Client, workers: Spawn, tmp_path: Path, kafka_client: str
) -> None:
    data = str(tmp_path / "data")
    second = await crash_and_restart(
        kafka_server, client, workers, DISK_APP, "--data-dir", data, kafka_client=kafka_client
    )
    await assert_from_local_state(client, second, CHANGELOG, PARTITIONS)


async def crash_and_restart(
    kafka_server: KafkaServer,
    client: Client,
    workers: Spawn,
    app: str,
    *options: str,
    kafka_client: str = "aiokafka",
) -> str:
    """The run: half the records, a kill -9 mid-run, the rest with a second worker (both
    on ``kafka_client``); the output checked. Returns the second worker's log."""
    url = broker_url(kafka_server.bootstrap, client=kafka_client)

    def start(name: str) -> WorkerProcess:
        return workers(name, "worker", app, "--broker", url, "--log-level", "info", *options)

    records = data_set()
    total = len(records)
    where: dict[str, tuple[int, int, int]] = {}  # id -> (partition, offset, timestamp)
    acks: dict[str, list[Ack]] = {"jc-orders": [], "jc-payments": []}

    async def produce(part: list[Rec]) -> None:
        for topic, sent in acks.items():
            mine = [r for r in part if r[0] == topic]
            got = await client.produce(
                topic, [(k.encode(), msgspec.json.encode({"id": i}), ts) for _, k, i, ts in mine]
            )
            where.update(
                {r[2]: (a.partition, a.offset, r[3]) for r, a in zip(mine, got, strict=True)}
            )
            sent.extend(got)

    async def committed() -> dict[str, dict[int, int]]:
        return {t: await client.committed(GROUP, t, PARTITIONS) for t in acks}

    # The first half is there before the worker starts (it merges both topics by
    # timestamp); kill it mid-run: some offsets committed, many records not yet. The topics
    # are made first: producing to a missing topic creates it with the broker's default
    # partition count (Apache Kafka's num.partitions is 1, Tansu's is 4), which the worker
    # would then refuse.
    await client.transport.create_topics([TopicSpec(t, PARTITIONS) for t in acks])
    half = total // 2
    await produce(records[:half])
    first = start("join-1")
    deadline = time.monotonic() + 20
    while sum(sum(c.values()) for c in (await committed()).values()) < half // 2:
        assert time.monotonic() < deadline, f"too little committed in 20 s:\n{first.err}"
        assert first.running(), first.err
        await asyncio.sleep(0.05)
    first.kill()
    assert first.popen.returncode == -9
    done = await committed()
    first_ends = {t: end_offsets(a, PARTITIONS) for t, a in acks.items()}
    uncommitted = sum(first_ends[t][p] - done[t][p] for t in acks for p in range(PARTITIONS))
    assert 0 < uncommitted <= half - half // 2, done

    # What the changelog held when it died: per partition, stream time and the offset of
    # the last record it had processed on each topic.
    state: dict[int, tuple[int, int, int]] = {}
    for m in await client.read(CHANGELOG, PARTITIONS):
        if m.key == b'["t"]' and m.value is not None:
            state[m.partition] = tuple(msgspec.json.decode(m.value))  # type: ignore[assignment]

    await produce(records[half:])
    second = start("join-2")
    for topic, sent in acks.items():
        await client.wait_committed(GROUP, topic, end_offsets(sent, PARTITIONS), deadline=30)
    assert await second.stop() == 0, second.err

    got = Counter(m.value.decode() for m in await client.read("jc-out", PARTITIONS) if m.value)
    expected = truth(records)
    assert set(got) == expected, (
        sorted(expected - set(got))[:10],
        sorted(set(got) - expected)[:10],
    )
    assert max(got.values()) <= 2  # one crash: a result comes out once more at most
    assert await client.read("joincrash-dlq", 1) == []  # a replay makes nothing late

    # Only results of records the changelog did not hold may repeat: a pair whose later
    # record came after the last one logged on its topic, or an unmatched record whose
    # window closed after the stream time logged.
    def replayed(ident: str) -> bool:
        p, offset, _ = where[ident]
        _, *high = state.get(p, (-(2**62), -1, -1))
        return offset > high[0 if ident.startswith("o") else 1]

    repeated = [r for r, n in got.items() if n == 2]
    for result in repeated:
        _, left, right = result.split(":")
        if "-" in (left, right):
            p, _, ts = where[left if right == "-" else right]
            assert ts + CLOSE_MS >= state.get(p, (-(2**62),))[0], result
        else:
            later = max((left, right), key=lambda i: where[i][2])
            assert replayed(later), (result, state)
    assert state, "the first worker wrote no changelog"
    assert "tables recovered" in second.err, second.err
    return second.err
