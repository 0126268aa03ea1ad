"""Losing the broker with records in flight: Apache Kafka, killed with SIGKILL and started
again on the same log directory and ports, with workers on both clients.

A worker process relays items (outputs, a table, dead letters: tests/kafka/apps/relay_app.py)
while the broker is SIGKILLed and restarted (each test on one client by default, on both
with FLOWKIT_TEST_ALL_CLIENTS=1). At-least-once: after de-duplication by
sequence number, every output, table entry and dead letter is there exactly, and none goes
missing. A record may appear more than once: it is processed again after a commit the outage
held back, and each of those two sends, if it was in flight at the kill, may be stored twice
(the producer retries it). So up to four copies, never more.

Only on Apache Kafka: the development broker (Tansu) keeps nothing over a restart in memory,
and tests/kafka/test_processes.py covers what a worker does then.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from flowkit.records import Message
from tests.apache_kafka import ApacheKafka
from tests.kafka.conftest import (
    Client,
    Spawn,
    broker_url,
    end_offsets,
    latest_by_key,
    start_worker,
)
from tests.tracebacks import crashes

pytestmark = [pytest.mark.kafka, pytest.mark.apache_kafka]

APP = "tests.kafka.apps.relay_app:app"
GROUP = "relay"
ITEMS, OUT, DLQ, CHANGELOG = "relay-items", "relay-out", "relay-dlq", "relay-seen-changelog"
PARTITIONS = 4
BAD_EVERY = 97
# An Apache Kafka start takes seconds (a JVM): workers wait for it longer than the default.
WAIT = {"connect_timeout": 60}


# Each outage takes about half a minute on a quiet machine: in the default run each test
# uses one client (both clients are covered across the three), and
# FLOWKIT_TEST_ALL_CLIENTS=1 runs every test on both.
BOTH = ["aiokafka", "rdkafka"]


def clients(default: str) -> pytest.MarkDecorator:
    every = os.environ.get("FLOWKIT_TEST_ALL_CLIENTS", "") not in ("", "0")
    return pytest.mark.parametrize("lost", BOTH if every else [default], indirect=True)


@pytest.fixture
def lost(
    request: pytest.FixtureRequest, clean_apache_kafka: ApacheKafka
) -> tuple[ApacheKafka, dict[str, Any]]:
    """The broker a test loses (the session's Apache Kafka, to the test alone and emptied
    after it) and the workers' client settings: aiokafka or librdkafka."""
    return clean_apache_kafka, {**WAIT, "client": request.param}


def items(first: int, count: int, keys: int = 16) -> list[tuple[bytes, bytes, None]]:
    return [
        (f"k{i % keys}".encode(), msgspec.json.encode({"key": f"k{i % keys}", "seq": i}), None)
        for i in range(first, first + count)
    ]


async def committed_total(client: Client) -> int:
    return sum((await client.committed(GROUP, ITEMS, PARTITIONS)).values())


async def wait_committed_at_least(client: Client, total: int, worker: object) -> None:
    deadline = time.monotonic() + 30
    while await committed_total(client) < total:
        assert time.monotonic() < deadline, f"nothing committed in 30 s:\n{worker}"
        await asyncio.sleep(0.05)


def seqs(messages: list[Message]) -> Counter[int]:
    return Counter(msgspec.json.decode(m.value)["seq"] for m in messages if m.value)


def table_seqs(messages: list[Message]) -> Counter[int]:
    table: Counter[int] = Counter()
    for value in latest_by_key(messages).values():
        table.update(msgspec.json.decode(value or b"[]"))
    return table


async def outcome(client: Client, total: int) -> tuple[Counter[int], Counter[int], Counter[int]]:
    """How often each sequence number reached the output, the table and the DLQ, following
    each topic until it holds what it should (a record that never arrives fails the wait)."""
    bad = {i for i in range(total) if i % BAD_EVERY == 0}
    good = set(range(total)) - bad

    def covers(expected: set[int], count: Callable[[list[Message]], Counter[int]]) -> Any:
        return lambda messages: expected <= set(count(messages))

    out = seqs(await client.follow(OUT, PARTITIONS, covers(good, seqs), deadline=60))
    dead = seqs(await client.follow(DLQ, 1, covers(bad, seqs), deadline=60))
    table = table_seqs(
        await client.follow(CHANGELOG, PARTITIONS, covers(good, table_seqs), deadline=60)
    )
    return out, table, dead


def assert_exact(counts: Counter[int], expected: set[int], what: str) -> None:
    assert set(counts) == expected, (what, sorted(expected ^ set(counts))[:20])
    assert max(counts.values(), default=1) <= 4, (what, counts.most_common(3))


def assert_no_client_noise(err: str) -> None:
    """Outages are reported by flowkit's own lines, not the client's per-attempt errors."""
    assert not crashes(err), err[-3000:]
    assert "ERROR aiokafka" not in err, err[-3000:]
    assert "ERROR flowkit.transports.rdkafka.librdkafka" not in err, err[-3000:]


@clients("aiokafka")
async def test_a_worker_rides_through_a_broker_kill_with_records_in_flight(
    lost: tuple[ApacheKafka, dict[str, Any]], workers: Spawn
) -> None:
    broker, settings = lost
    client = Client(broker.bootstrap)
    try:
        worker = start_worker(workers, "relay", APP, broker_url(broker.bootstrap, **settings))
        await worker.wait_for_log("tables recovered")
        total = 2_000
        acks = await client.produce(ITEMS, items(0, total))
        await wait_committed_at_least(client, 600, worker.err)

        broker.stop()  # SIGKILL, mid-stream: sends, fetches and commits in flight
        # Started again once the worker has seen it go (a JVM start keeps it away seconds).
        await worker.wait_for_log("Kafka broker unreachable", deadline=30)
        broker.start()

        await client.wait_committed(GROUP, ITEMS, end_offsets(acks, PARTITIONS), deadline=60)
        await worker.wait_for_log("Kafka broker is back")  # probed every 0.5 s while away
        assert worker.running(), worker.err
        assert await worker.stop() == 0, worker.err
        bad = {i for i in range(total) if i % BAD_EVERY == 0}
        out, table, dead = await outcome(client, total)
        assert_exact(out, set(range(total)) - bad, "outputs")
        assert_exact(table, set(range(total)) - bad, "table")
        assert_exact(dead, bad, "dead letters")
        err = worker.err
        assert err.count("Kafka broker unreachable") == 1, err[-3000:]
        assert err.count("Kafka broker is back") == 1, err[-3000:]
        assert_no_client_noise(err)
    finally:
        await client.aclose()


@clients("rdkafka")
async def test_a_broker_away_too_long_stops_the_worker_and_a_restart_finishes_the_job(
    lost: tuple[ApacheKafka, dict[str, Any]], workers: Spawn
) -> None:
    broker, settings = lost
    client = Client(broker.bootstrap)
    try:
        url = broker_url(broker.bootstrap, broker_timeout=2, **settings)
        first = start_worker(workers, "relay-1", APP, url)
        await first.wait_for_log("tables recovered")
        total = 2_000
        acks = await client.produce(ITEMS, items(0, total))
        await wait_committed_at_least(client, 400, first.err)

        broker.stop()
        assert await first.wait(deadline=30) == 1, first.err
        err = first.err
        errors = [line for line in err.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, err[-3000:]
        assert "BrokerUnavailable" in errors[0] and broker.bootstrap in errors[0]
        assert "unreachable for" in errors[0] and "broker_timeout=2 s" in errors[0]
        assert err.count("Kafka broker unreachable") == 1
        assert_no_client_noise(err)

        broker.start()
        committed = await client.committed(GROUP, ITEMS, PARTITIONS)
        # Nothing is committed past what was acknowledged: every record below a committed
        # offset has its output (or dead letter) and its table entry on the broker.
        done = {seq for seq, ack in enumerate(acks) if ack.offset < committed[ack.partition]}
        assert done, committed
        good, bad = {s for s in done if s % BAD_EVERY}, {s for s in done if not s % BAD_EVERY}
        await client.follow(OUT, PARTITIONS, lambda ms: good <= set(seqs(ms)), deadline=60)
        await client.follow(DLQ, 1, lambda ms: bad <= set(seqs(ms)), deadline=60)
        await client.follow(
            CHANGELOG, PARTITIONS, lambda ms: good <= set(table_seqs(ms)), deadline=60
        )

        second = start_worker(workers, "relay-2", APP, broker_url(broker.bootstrap, **settings))
        await second.wait_for_log("tables recovered", deadline=60)
        await client.wait_committed(GROUP, ITEMS, end_offsets(acks, PARTITIONS), deadline=60)
        assert await second.stop() == 0, second.err
        bad = {i for i in range(total) if i % BAD_EVERY == 0}
        out, table, dead = await outcome(client, total)
        assert_exact(out, set(range(total)) - bad, "outputs")
        assert_exact(table, set(range(total)) - bad, "table")
        assert_exact(dead, bad, "dead letters")
        assert_no_client_noise(second.err)
    finally:
        await client.aclose()


@clients("aiokafka")
async def test_a_broker_restart_during_a_rebalance_loses_nothing(
    lost: tuple[ApacheKafka, dict[str, Any]], workers: Spawn
) -> None:
    broker, settings = lost
    client = Client(broker.bootstrap)
    try:
        url = broker_url(broker.bootstrap, **settings)
        first = start_worker(workers, "relay-a", APP, url)
        await first.wait_for_log("tables recovered")
        total = 2_000
        acks = await client.produce(ITEMS, items(0, total))
        await wait_committed_at_least(client, 300, first.err)

        second = start_worker(workers, "relay-b", APP, url)  # the group rebalances...
        await second.wait_for_log("worker started", deadline=60)  # it joins next
        broker.stop()  # ...and loses its broker in the middle of it
        await asyncio.sleep(2)
        broker.start()

        await client.wait_committed(GROUP, ITEMS, end_offsets(acks, PARTITIONS), deadline=90)
        assert first.running() and second.running(), first.err + second.err
        assert await first.stop() == 0, first.err
        assert await second.stop() == 0, second.err
        bad = {i for i in range(total) if i % BAD_EVERY == 0}
        out, table, dead = await outcome(client, total)
        assert_exact(out, set(range(total)) - bad, "outputs")
        assert_exact(table, set(range(total)) - bad, "table")
        assert_exact(dead, bad, "dead letters")
        for err in (first.err, second.err):
            assert_no_client_noise(err)
    finally:
        await client.aclose()
