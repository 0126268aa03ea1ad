"""Workers as real processes on a real broker: scale-out, crashes, stops, broker outages.

Each test has a broker to itself (``kafka_server``: Apache Kafka, or for the tests about
the development broker a Tansu of its own) and runs
``python -m flowkit.cli worker tests.kafka.apps.X:app`` processes against it; the test
produces the input, reads the outputs, changelogs and committed offsets itself, and
asserts exact outcomes. Kill, stop and restart are real signals to real processes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import signal
import socket
import time
from collections import Counter

import msgspec
import pytest

from examples import ysb
from flowkit.transports import TopicSpec
from flowkit.windows import WindowResult
from tests.kafka.conftest import (
    ON_APACHE_KAFKA,
    ON_TANSU,
    Client,
    KafkaServer,
    Spawn,
    broker_url,
    end_offsets,
    latest_by_key,
    start_worker,
    until,
)
from tests.tracebacks import crashes

pytestmark = pytest.mark.kafka

YSB_APP = "tests.kafka.apps.ysb_app:app"
COUNTS_APP = "tests.kafka.apps.counts_app:app"
COUNTS_GROUP = "counts"  # the app's name is its group id
ITEMS = "count-items"
CHANGELOG = "counts-seen-changelog"
PARTITIONS = 4
WINDOW_MS = 10_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def items(first: int, count: int, keys: int = 16) -> list[tuple[bytes, bytes, None]]:
    """Items ``first .. first+count-1`` for the counts app, keyed over ``keys`` keys."""
    return [
        (f"k{i % keys}".encode(), msgspec.json.encode({"key": f"k{i % keys}", "seq": i}), None)
        for i in range(first, first + count)
    ]


async def seen_by_seq(client: Client) -> Counter[int]:
    """How many times the counts app's final table holds each sequence number."""
    table = latest_by_key(await client.read(CHANGELOG, PARTITIONS))
    seen: Counter[int] = Counter()
    for value in table.values():
        assert value is not None
        seen.update(msgspec.json.decode(value))
    return seen


def assigned_events(worker_assignments: list[set[str]], topic: str) -> set[int]:
    """Partitions of ``topic`` in the worker's latest logged assignment."""
    if not worker_assignments:
        return set()
    return {int(p.rsplit("/", 1)[1]) for p in worker_assignments[-1] if p.startswith(topic + "/")}


def assert_clean(*logs: str) -> None:
    for log in logs:
        assert not crashes(log), log


# -- 1. two worker processes share the YSB work ---------------------------------------------


def ysb_data_set(count: int = 8_000) -> tuple[list[tuple[bytes, bytes, int]], Counter]:
    """Events about a minute behind the wall clock, a little out of order (within the
    grace); and the ground truth {(campaign, window start): views}."""
    start_ms = int(time.time() * 1000) - 75_000
    start_ms -= start_ms % WINDOW_MS
    rng = random.Random(5)
    mapping = ysb.campaign_map()
    truth: Counter[tuple[str, int]] = Counter()
    records = []
    for user, event in ysb.generate_events(count, start_ms=start_ms, per_second=200):
        event.event_time -= rng.randint(0, 2_000)
        records.append((user.encode(), msgspec.json.encode(event), event.event_time))
        if event.event_type == "view":
            t = event.event_time
            truth[mapping[event.ad_id], t - t % WINDOW_MS] += 1
    return records, truth


@ON_APACHE_KAFKA
async def test_two_worker_processes_split_ysb_and_count_exactly(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    url = broker_url(kafka_server.bootstrap)
    a = start_worker(workers, "ysb-a", YSB_APP, url)
    b = start_worker(workers, "ysb-b", YSB_APP, url)

    # Both join and the group splits the four partitions between them.
    def split() -> bool:
        mine = [assigned_events(w.assigned(), "ysb-events") for w in (a, b)]
        return all(mine) and not mine[0] & mine[1] and mine[0] | mine[1] == {0, 1, 2, 3}

    await until(split, 30, "the two workers to split ysb-events")
    parts_a = assigned_events(a.assigned(), "ysb-events")
    parts_b = assigned_events(b.assigned(), "ysb-events")
    assert len(parts_a) == len(parts_b) == 2  # range assignment: two each

    records, truth = ysb_data_set()
    await client.produce("ysb-events", records)

    # Every window closes once its partitions are caught up and idle (ysb_app.IDLE_TIMEOUT).
    def complete(messages: list) -> bool:
        return len(messages) >= len(truth)

    await client.follow("ysb-window-counts", PARTITIONS, complete, deadline=45)
    await asyncio.sleep(1.5)  # time for a duplicate emission to show up, if there were one
    results = [
        msgspec.json.decode(m.value, type=WindowResult)
        for m in await client.read("ysb-window-counts", PARTITIONS)
    ]
    emitted = [(r.key, r.start) for r in results]
    assert len(emitted) == len(set(emitted)), "a window was emitted twice"
    assert Counter({(r.key, r.start): r.value for r in results}) == truth
    assert {r.end - r.start for r in results} == {WINDOW_MS}
    assert await client.read("ysb-dlq", 1) == []  # nothing was late or failed

    assert await a.stop() == 0, a.err
    assert await b.stop() == 0, b.err
    # Both did part of the work (events and partials of the partitions they own).
    assert a.processed() > 0 and b.processed() > 0
    assert_clean(a.err, b.err)


# -- 2. kill -9 mid-run, restart: nothing lost, bounded duplicates, state recovered ----------


# The worker processes use librdkafka by default: aiokafka workers are killed mid-run
# with their tables recovered from the changelog in tests/kafka/test_join_crash.py and
# test_worker_processes.py, so each client is killed in every run;
# FLOWKIT_TEST_ALL_CLIENTS=1 runs this test on both (the test's own client is aiokafka
# either way).
KILL_CLIENTS = (
    ["aiokafka", "rdkafka"]
    if os.environ.get("FLOWKIT_TEST_ALL_CLIENTS", "") not in ("", "0")
    else ["rdkafka"]
)


@ON_APACHE_KAFKA
@pytest.mark.parametrize("kafka_client", KILL_CLIENTS)
async def test_sigkill_mid_run_loses_nothing_and_recovers_table_state(
    kafka_server: KafkaServer, client: Client, workers: Spawn, kafka_client: str
) -> None:
    url = broker_url(kafka_server.bootstrap, client=kafka_client)
    first = start_worker(workers, "counts-1", COUNTS_APP, url)
    await first.wait_for_log("tables recovered")
    total = 4_000
    acks = await client.produce(ITEMS, items(0, total))
    where = {seq: (ack.partition, ack.offset) for seq, ack in enumerate(acks)}
    ends = end_offsets(acks, PARTITIONS)

    # Kill the worker while it is mid-run: some offsets committed, many records not yet.
    async def committed_sum() -> int:
        return sum((await client.committed(COUNTS_GROUP, ITEMS, PARTITIONS)).values())

    deadline = time.monotonic() + 20
    while await committed_sum() < 800:
        assert time.monotonic() < deadline, f"nothing committed in 20 s:\n{first.err}"
        assert first.running(), first.err
        await asyncio.sleep(0.05)
    first.kill()
    assert first.popen.returncode == -9

    # Read before the restart: with the worker dead, these are its last commits.
    committed = await client.committed(COUNTS_GROUP, ITEMS, PARTITIONS)
    uncommitted = sum(ends[p] - committed[p] for p in range(PARTITIONS))
    assert 0 < uncommitted < total - 800, (committed, ends)

    second = start_worker(workers, "counts-2", COUNTS_APP, url)
    await client.wait_committed(COUNTS_GROUP, ITEMS, ends, deadline=40)
    assert await second.stop() == 0, second.err

    seen = await seen_by_seq(client)
    # No record is lost: every sequence number is in the final table.
    assert set(seen) == set(range(total)), sorted(set(range(total)) - set(seen))[:20]
    # Records before the last committed offset were counted exactly once; those after
    # it may have been counted twice (processed and written to the changelog before the
    # kill, processed again after the restart), never more.
    for seq, count in seen.items():
        partition, offset = where[seq]
        if offset < committed[partition]:
            assert count == 1, (seq, partition, offset, committed)
        else:
            assert count in (1, 2), (seq, count)
    duplicates = sum(seen.values()) - total
    assert duplicates <= uncommitted
    # The restarted worker read exactly the uncommitted records...
    assert second.processed() == uncommitted
    # ...and rebuilt the first worker's table state from the changelog: the sequence
    # numbers it never read (offsets below the committed ones) reached its table only so.
    recovered = [int(n) for n in re.findall(r"tables recovered.* records=(\d+)", second.err)]
    assert sum(recovered) > 0, second.err
    assert_clean(second.err)


# -- 3. SIGTERM mid-run, restart: every record exactly once ----------------------------------


@ON_APACHE_KAFKA
async def test_sigterm_and_restart_process_every_record_exactly_once(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    url = broker_url(kafka_server.bootstrap)
    first = start_worker(workers, "counts-1", COUNTS_APP, url)
    await first.wait_for_log("tables recovered")
    acks = await client.produce(ITEMS, items(0, 2_000))

    deadline = time.monotonic() + 20
    while (done := sum((await client.committed(COUNTS_GROUP, ITEMS, PARTITIONS)).values())) < 400:
        assert time.monotonic() < deadline, f"nothing committed in 20 s:\n{first.err}"
        await asyncio.sleep(0.05)
    assert done < 2_000  # mid-run: part of the input is not committed yet
    # Stop while records are still being processed, and go on producing meanwhile.
    assert first.running(), first.err
    first.popen.send_signal(signal.SIGTERM)
    acks += await client.produce(ITEMS, items(2_000, 2_000))
    assert await first.wait(20) == 0, first.err
    assert "stopping gracefully" in first.err
    committed = await client.committed(COUNTS_GROUP, ITEMS, PARTITIONS)
    ends = end_offsets(acks, PARTITIONS)
    left = sum(ends[p] - committed[p] for p in range(PARTITIONS))
    assert 0 < left <= 4_000 - done
    # A graceful stop commits what it processed: every committed record had been read.
    assert 4_000 - left <= first.processed()

    second = start_worker(workers, "counts-2", COUNTS_APP, url)
    await client.wait_committed(COUNTS_GROUP, ITEMS, ends, deadline=40)
    assert await second.stop() == 0, second.err

    seen = await seen_by_seq(client)
    assert seen == Counter(range(4_000))  # each record counted once: none lost, none twice
    assert second.processed() == left  # the restart resumed exactly at the commits
    assert await client.read("counts-dlq", 1) == []
    assert_clean(first.err, second.err)


# -- 4. the broker unreachable, late, or restarted -----------------------------------------


async def _accept_and_close(times: list[float]) -> asyncio.Server:
    """A TCP server that hangs up on every connection: a port that is not Kafka."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        times.append(time.monotonic())
        writer.close()

    return await asyncio.start_server(hang_up, "127.0.0.1", 0)


@pytest.mark.parametrize("endpoint", ["refused", "hangs-up"])
async def test_unreachable_broker_is_one_error_line_after_connect_timeout(
    endpoint: str, workers: Spawn
) -> None:
    connections: list[float] = []
    server = await _accept_and_close(connections) if endpoint == "hangs-up" else None
    try:
        port = server.sockets[0].getsockname()[1] if server else free_port()
        url = broker_url(f"127.0.0.1:{port}", connect_timeout=3)
        worker = start_worker(workers, "worker", COUNTS_APP, url)
        code = await worker.wait(20)
        took = time.monotonic() - worker.started
    finally:
        if server is not None:
            server.close()
            await server.wait_closed()
    assert code == 1
    lines = worker.err.splitlines()
    assert [line for line in lines if line.startswith("Error:")] == [lines[-1]]
    assert lines[-1].startswith(
        f"Error: worker failed: BrokerUnavailable: no Kafka broker at 127.0.0.1:{port} ("
    )
    assert lines[-1].endswith("gave up after 3 s, see the connect_timeout setting)")
    assert sum("waiting for a Kafka broker" in line for line in lines) == 1  # not per retry
    assert_clean(worker.err)
    assert took >= 3  # not before the deadline (the wait above bounds it from above)
    if server is not None:
        # Each attempt is a TCP probe and a bootstrap; attempts back off 0.05 s, 0.1 s, ...
        # up to 1 s between tries: a handful of them in 3 s, not a busy loop.
        attempts = [t for i, t in enumerate(connections) if i == 0 or t - connections[i - 1] > 0.03]
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        assert 4 <= len(attempts) <= 12, gaps
        assert gaps[0] < 0.3 and max(gaps) >= 0.5, gaps


@ON_TANSU
async def test_worker_waits_for_a_broker_that_starts_late(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    kafka_server.stop()  # the port is known, nothing listens on it yet
    url = broker_url(kafka_server.bootstrap, connect_timeout=20)
    worker = start_worker(workers, "counts", COUNTS_APP, url)
    await worker.wait_for_log("waiting for a Kafka broker")
    await asyncio.sleep(1.0)
    assert worker.running(), worker.err
    kafka_server.start()  # on the same port, inside the worker's retry window
    await worker.wait_for_log("tables recovered")
    acks = await client.produce(ITEMS, items(0, 300))
    await client.wait_committed(COUNTS_GROUP, ITEMS, end_offsets(acks, PARTITIONS), 20)
    assert await worker.stop() == 0, worker.err
    assert await seen_by_seq(client) == Counter(range(300))
    assert worker.processed() == 300
    assert_clean(worker.err)


@ON_TANSU
async def test_worker_rejoins_after_a_broker_restart_while_idle(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    """With memory storage a restart loses every topic, record and offset (docs/kafka.md), so
    what can be checked is that the worker rides through the outage: it rejoins the
    group on the new broker and processes what is produced there, each record once."""
    url = broker_url(kafka_server.bootstrap)
    worker = start_worker(workers, "counts", COUNTS_APP, url)
    await worker.wait_for_log("tables recovered")
    acks = await client.produce(ITEMS, items(0, 300))
    await client.wait_committed(COUNTS_GROUP, ITEMS, end_offsets(acks, PARTITIONS), 20)

    kafka_server.restart()  # everything committed and idle: no commit is in flight
    # The new broker does not know the member: its heartbeat fails and it joins again.
    await until(lambda: len(worker.assigned()) >= 2, 20, "the worker to rejoin the group")
    assert worker.running(), worker.err
    acks = await client.produce(ITEMS, items(300, 300))
    await client.wait_committed(COUNTS_GROUP, ITEMS, end_offsets(acks, PARTITIONS), 20)
    assert await worker.stop() == 0, worker.err
    # The new broker's changelog holds exactly the records produced to it, once each.
    assert await seen_by_seq(client) == Counter(range(300, 600))
    assert worker.processed() == 600
    assert_clean(worker.err)


# -- 5. flowkit topics ---------------------------------------------------------------------

TOPIC_ROW = re.compile(r"^(\S+) +(\d+) +(\S+)  (.*?)\s*$")
NEEDED = {ITEMS: 4, "counts-dlq": 1, CHANGELOG: 4}


def topic_rows(out: str) -> dict[str, tuple[int, str, str]]:
    """``flowkit topics`` output as {topic: (needs, on broker, status)}."""
    lines = out.splitlines()
    assert lines[0].split() == ["topic", "needs", "on", "broker", "notes"], out
    rows = {}
    for line in lines[1:]:
        match = TOPIC_ROW.match(line)
        assert match is not None, line
        rows[match[1]] = (int(match[2]), match[3], match[4])
    return rows


@ON_TANSU
async def test_topics_before_and_after_a_worker_ran(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    url = broker_url(kafka_server.bootstrap)
    before = workers("topics-before", "topics", COUNTS_APP, "--broker", url)
    assert await before.wait(20) == 0, before.err
    missing = "missing (created when a worker starts)"
    assert topic_rows(before.out) == {
        ITEMS: (4, "-", missing),
        "counts-dlq": (1, "-", missing),
        CHANGELOG: (4, "-", f"compacted; {missing}"),
    }
    assert await client.partition_count(ITEMS) is None  # looking created nothing

    worker = start_worker(workers, "counts", COUNTS_APP, url)
    await worker.wait_for_log("tables recovered")
    assert await worker.stop() == 0, worker.err

    after = workers("topics-after", "topics", COUNTS_APP, "--broker", url)
    assert await after.wait(20) == 0, after.err
    assert topic_rows(after.out) == {
        ITEMS: (4, "4", "ok"),
        "counts-dlq": (1, "1", "ok"),
        CHANGELOG: (4, "4", "compacted; ok"),
    }
    assert_clean(before.err, worker.err, after.err)


@ON_APACHE_KAFKA
async def test_a_partition_count_mismatch_stops_the_worker_with_one_line(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    await client.transport.create_topics([TopicSpec(ITEMS, 2)])
    url = broker_url(kafka_server.bootstrap)
    topics = workers("topics", "topics", COUNTS_APP, "--broker", url)
    assert await topics.wait(20) == 1, topics.err
    rows = topic_rows(topics.out)
    assert rows[ITEMS] == (4, "2", "MISMATCH: 2 partitions; a worker refuses to start")
    assert rows["counts-dlq"][1:] == ("-", "missing (created when a worker starts)")

    worker = start_worker(workers, "counts", COUNTS_APP, url)
    assert await worker.wait(20) == 2, worker.err
    errors = [line for line in worker.err.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: topic {ITEMS!r} exists with 2 partitions, the app declares 4",
    ], worker.err
    assert worker.err.splitlines()[-1] == errors[0]
    assert "worker started" not in worker.err
    assert await client.partition_count(ITEMS) == 2  # left as it was
    assert_clean(topics.err, worker.err)
