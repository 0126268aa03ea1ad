"""Exactly-once processing on Apache Kafka, through both clients.

Worker processes run ``tests/kafka/apps/eos_app.py`` (an agent with a table, a windowed
table, a stream-stream join) with ``--processing-guarantee exactly_once``. One test kills
the worker with SIGKILL three times mid-run; one pauses a worker with SIGSTOP past its
session timeout while another takes its partitions over, then lets it go on (a zombie).
Afterwards a ``read_committed`` reader of the outputs must see every result exactly once:
nothing lost, nothing twice, and every count as the records say. The kill test also runs
with every store on ``rocksdb://`` (``eos_disk_app``), each worker on the same data
directory: each restart must resume from the local state written at the last commit.

Both clients run each test: aiokafka and librdkafka (``client=rdkafka``). The test broker
keeps records for ever (``log.retention.ms=-1``): these records' event times are years old,
and time-based retention deleted them under the workers (the cause of the "offsets stop
being committed" failures of this test).

Apache Kafka, not Tansu: Tansu's ``read_committed`` readers see aborted records.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from flowkit.partitioning import partition_for_key
from flowkit.transports import TopicSpec
from tests.apache_kafka import ApacheKafka
from tests.kafka.apps.eos_app import PARTITIONS, WINDOW, WITHIN
from tests.kafka.conftest import Client, Spawn, WorkerProcess, broker_url

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.eos_app:app"
DISK_APP = "tests.kafka.apps.eos_disk_app:app"  # every store on rocksdb://
LISTS_APP = "tests.kafka.apps.eos_lists_app:app"
GROUP = "eos"
T0 = 1_700_000_000_000
FAR = 600_000  # ms: the flush records' event time ahead of the rest, closing every window
KEYS = 12
# A killed worker's open transaction holds read_committed readers back until the broker
# aborts it: keep that short (the broker looks for timed-out transactions every second).
# A checkpoint waits for the agents to finish their queued batches, and a fetch returns
# whole broker batches: small fetches keep that short for these slow agents.
# A member that misses its session is fenced for good: sessions long enough for a loaded
# machine (the zombie test pauses a worker past it).
SETTINGS = {
    "transaction_timeout_ms": 5000,
    "max_partition_fetch_bytes": 4096,
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
}
CLIENTS = ["aiokafka", "rdkafka"]
# Runs of the lists test per client: 1 in CI; more to look for a rare loss (a list waiting
# for records as a commit cuts in is a matter of timing), e.g.
# FLOWKIT_EOS_RUNS=20 pytest tests/kafka/test_exactly_once.py -k "lists and aiokafka"
RUNS = int(os.environ.get("FLOWKIT_EOS_RUNS", "1"))
# The lists' cut at a commit is the shared runtime's (streams/source.py, tested alone in
# tests/streams/test_lists_at_commits.py): by default the kills run on the default client
# only, and FLOWKIT_TEST_ALL_CLIENTS=1 runs them on both.
ALL = os.environ.get("FLOWKIT_TEST_ALL_CLIENTS", "") not in ("", "0")
LIST_CLIENTS = CLIENTS if ALL else ["aiokafka"]
# Three kills of a plain agent: on librdkafka by default, since the lists' kills above run
# on aiokafka, so each client is killed mid-transaction in every run (both with the switch).
KILL_CLIENTS = CLIENTS if ALL else ["rdkafka"]

Item = tuple[str, int, int]  # key, seq, event time
Ev = tuple[str, str, str, int]  # topic, key, id, timestamp


def url_for(kafka: ApacheKafka, client: str) -> str:
    extra = {"client": "rdkafka"} if client == "rdkafka" else {}
    return broker_url(kafka.bootstrap, **SETTINGS, **extra)


def flush_keys(prefix: str) -> list[str]:
    """One key per partition: records far ahead in event time close every window."""
    keys: dict[int, str] = {}
    for i in range(1000):
        p = partition_for_key(f"{prefix}{i}".encode(), PARTITIONS)
        keys.setdefault(p, f"{prefix}{i}")
    return list(keys.values())


def item_set(count: int) -> list[Item]:
    items = [(f"k{n % KEYS}", n, T0 + n * 50) for n in range(count)]
    end = T0 + count * 50 + FAR
    return items + [(key, count + i, end) for i, key in enumerate(flush_keys("f"))]


def event_set(count: int) -> list[Ev]:
    rng = random.Random(7)
    evs: list[Ev] = []
    for n in range(count):
        topic = "eos-orders" if rng.random() < 0.5 else "eos-payments"
        evs.append((topic, f"j{n % 40}", f"{topic[4]}{n}", T0 + n * 100))
    end = T0 + count * 100 + FAR
    return evs + [("eos-orders", key, f"flush-{key}", end) for key in flush_keys("g")]


def tally_truth(items: list[Item]) -> Counter[str]:
    seen: Counter[str] = Counter()
    out: Counter[str] = Counter()
    for key, seq, _ in items:
        seen[key] += 1
        out[f"{key}:{seq}:{seen[key]}"] += 1
    return out


def window_truth(items: list[Item]) -> Counter[tuple[str, int, int]]:
    size = int(WINDOW * 1000)
    per: Counter[tuple[str, int]] = Counter(
        (k, ts // size * size) for k, _, ts in items if not k.startswith("f")
    )
    return Counter({(k, start, n): 1 for (k, start), n in per.items()})


def join_truth(evs: list[Ev]) -> Counter[str]:
    orders = [e for e in evs if e[0] == "eos-orders"]
    payments = [e for e in evs if e[0] == "eos-payments"]
    within = int(WITHIN * 1000)
    return Counter(
        f"{o[1]}:{o[2]}:{p[2]}"
        for o in orders
        for p in payments
        if o[1] == p[1] and abs(o[3] - p[3]) <= within
    )


@pytest.fixture
async def reader(clean_apache_kafka: ApacheKafka) -> AsyncIterator[Client]:
    """The test's client; it reads ``read_committed``: aborted records stay unseen."""
    c = Client(clean_apache_kafka.bootstrap, isolation_level="read_committed")
    try:
        yield c
    finally:
        await c.aclose()


async def produce_inputs(
    reader: Client, items: list[Item], evs: list[Ev], items_topic: str = "eos-items"
) -> None:
    """The inputs, in small broker batches (a fetch returns whole ones, and a checkpoint
    waits for each agent to finish the batch it is on)."""
    await reader.transport.create_topics(
        [TopicSpec(t, PARTITIONS) for t in (items_topic, "eos-orders", "eos-payments")]
    )
    records = [
        (items_topic, k.encode(), msgspec.json.encode({"key": k, "seq": s, "ts": ts}), ts)
        for k, s, ts in items
    ]
    records += [(t, k.encode(), msgspec.json.encode({"id": i}), ts) for t, k, i, ts in evs]
    producer = reader.transport.producer(client_id="test-producer")
    await producer.start()
    try:
        for start in range(0, len(records), 200):
            acks = [
                await producer.send(topic, value, key=key, timestamp_ms=ts)
                for topic, key, value, ts in records[start : start + 200]
            ]
            for ack in acks:
                await ack
    finally:
        await producer.aclose()


async def outputs(
    reader: Client,
) -> tuple[Counter[str], Counter[tuple[str, int, int]], Counter[str]]:
    tally = Counter(m.value.decode() for m in await reader.read("eos-tally", PARTITIONS) if m.value)
    windows: Counter[tuple[str, int, int]] = Counter()
    for m in await reader.read("eos-windows", PARTITIONS):
        assert m.value is not None
        w = msgspec.json.decode(m.value)
        if not w["key"].startswith("f"):  # the flush records' windows close when idle
            windows[(w["key"], w["start"], w["value"])] += 1
    joined = Counter(
        m.value.decode() for m in await reader.read("eos-joined", PARTITIONS) if m.value
    )
    return tally, windows, joined


async def until_complete(
    reader: Client, items: list[Item], evs: list[Ev], deadline: float, *running: WorkerProcess
) -> None:
    """Wait until every expected output is there (read_committed), then check each is
    there exactly once."""
    want = (tally_truth(items), window_truth(items), join_truth(evs))
    end = time.monotonic() + deadline
    while True:
        got = await outputs(reader)
        if all(set(g) >= set(w) for g, w in zip(got, want, strict=True)):
            break
        if time.monotonic() > end:
            missing = [sorted(set(w) - set(g))[:5] for g, w in zip(got, want, strict=True)]
            missing += [sorted(set(g) - set(w))[:5] for g, w in zip(got, want, strict=True)]
            offsets = await reader.committed(GROUP, "eos-items", PARTITIONS)
            logs = f"committed {offsets}\n" + "\n".join(w.err[-3000:] for w in running)
            pytest.fail(f"outputs missing after {deadline} s: {missing}\n{logs}")
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # anything more than expected would be in by now
    got = await outputs(reader)
    for name, g, w in zip(("tally", "windows", "joined"), got, want, strict=True):
        twice = [r for r, n in g.items() if n > 1]
        assert not twice, f"{name}: results more than once: {twice[:10]}"
        assert set(g) == set(w), f"{name}: extra {sorted(set(g) - set(w))[:10]}"


def start(workers: Spawn, name: str, url: str, app: str = APP, *more: str) -> WorkerProcess:
    return workers(
        name,
        "worker",
        app,
        "--broker",
        url,
        "--log-level",
        "debug",
        "--processing-guarantee",
        "exactly_once",
        *more,
    )


RECOVERED = re.compile(
    r"tables recovered +from_local_state=(\d+) from_standby=\d+ partitions=\[([^\]]*)\] "
    r"records=(\d+)"
)


def assert_resumed_from_disk(worker: WorkerProcess) -> None:
    """Every table partition ``worker`` was given came from its local databases (the last
    commit's state, then the changelog's tail), none was rebuilt from the changelog."""
    err = worker.err
    assert "local state not used" not in err, err[-6000:]
    lines = RECOVERED.findall(err)
    assert lines, err[-6000:]
    for local, partitions, _ in lines:
        # Each partition: the tally's table, the windowed table and the join's buffers.
        assert int(local) == 3 * len(partitions.split(",")), (lines, err[-6000:])


async def committed_some(
    reader: Client, worker: WorkerProcess, at_least: int, group: str = GROUP
) -> None:
    topic = f"{group}-items"
    end = time.monotonic() + 60
    while sum((await reader.committed(group, topic, PARTITIONS)).values()) < at_least:
        assert worker.running(), worker.err
        assert time.monotonic() < end, f"nothing committed in 60 s:\n{worker.err[-6000:]}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("store", ["memory", "rocksdb"])
@pytest.mark.parametrize("client", KILL_CLIENTS)
async def test_three_kills_mid_transaction_lose_and_repeat_nothing(
    clean_apache_kafka: ApacheKafka,
    reader: Client,
    workers: Spawn,
    client: str,
    store: str,
    tmp_path: Path,
) -> None:
    # On rocksdb:// every worker uses the same data directory: each restart opens the
    # state its predecessor wrote at its last commit and replays only the changelog after.
    url = url_for(clean_apache_kafka, client)
    disk = store == "rocksdb"
    app, more = (DISK_APP, ("--data-dir", str(tmp_path / "data"))) if disk else (APP, ())
    items, evs = item_set(3_000), event_set(800)
    await produce_inputs(reader, items, evs)
    committed = 0
    for round_ in range(3):
        worker = start(workers, f"eos-{round_}", url, app, *more)
        await committed_some(reader, worker, committed + 1)
        # Commits every 0.3 s or so, the tally agent about 1 ms a record: one is open.
        await asyncio.sleep(random.uniform(0.2, 0.8))
        worker.kill()
        assert worker.popen.returncode == -9
        before, committed = (
            committed,
            sum((await reader.committed(GROUP, "eos-items", PARTITIONS)).values()),
        )
        assert before < committed < len(items), (before, committed, worker.err)
        if disk and round_ > 0:
            assert_resumed_from_disk(worker)
    last = start(workers, "eos-last", url, app, *more)
    await last.wait_for_log("worker started", deadline=30)
    await until_complete(reader, items, evs, 60, last)
    assert await last.stop() == 0, last.err
    if disk:
        assert_resumed_from_disk(last)


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_zombie_is_fenced_and_nothing_repeats(
    clean_apache_kafka: ApacheKafka, reader: Client, workers: Spawn, client: str
) -> None:
    url = url_for(clean_apache_kafka, client)
    items, evs = item_set(4_000), event_set(800)
    await produce_inputs(reader, items, evs)
    zombie = start(workers, "eos-zombie", url)
    await committed_some(reader, zombie, 200)
    other = start(workers, "eos-other", url)
    await other.wait_for_log(r"partitions assigned", deadline=30)
    os.kill(zombie.pid, signal.SIGSTOP)  # past its session timeout (6 s): the group moves on
    try:
        await other.wait_for_log(r"partitions assigned.*\n(.|\n)*partitions assigned", 30)
        await asyncio.sleep(1.0)
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    await zombie.wait_for_log(r"fenced: another worker took over", deadline=30)
    await until_complete(reader, items, evs, 60, zombie, other)
    assert await zombie.stop() == 0, zombie.err
    assert await other.stop() == 0, other.err


async def until_listed(
    reader: Client, items: list[Item], deadline: float, *running: WorkerProcess
) -> None:
    """``until_complete`` for the lists app: both agents' lines, each exactly once. If
    some are missing at the deadline, every line read (with its partition and offset) is
    written to ``outputs.txt`` beside the workers' logs, to see what was lost."""
    want = tally_truth(items)
    end = time.monotonic() + deadline
    while True:
        got = [
            Counter(m.value.decode() for m in await reader.read(topic, PARTITIONS) if m.value)
            for topic in ("eosl-took", "eosl-batched")
        ]
        if all(set(g) >= set(want) for g in got):
            break
        if time.monotonic() > end:
            missing = [sorted(set(want) - set(g))[:40] for g in got]
            extra = [sorted(set(g) - set(want))[:40] for g in got]
            offsets = await reader.committed("eosl", "eosl-items", PARTITIONS)
            dump = running[0].err_path.parent / "outputs.txt"
            with dump.open("w") as out:
                for topic in ("eosl-took", "eosl-batched"):
                    for m in await reader.read(topic, PARTITIONS):
                        out.write(f"{topic} {m.partition} {m.offset} {m.value!r}\n")
            logs = f"committed {offsets}, every line in {dump}\n"
            logs += "\n".join(w.err[-3000:] for w in running)
            pytest.fail(f"outputs missing after {deadline} s: {missing}, extra {extra}\n{logs}")
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # anything more than expected would be in by now
    for topic in ("eosl-took", "eosl-batched"):
        lines = [m.value.decode() for m in await reader.read(topic, PARTITIONS) if m.value]
        twice = [r for r, n in Counter(lines).items() if n > 1]
        assert not twice, f"{topic}: results more than once: {twice[:10]}"
        assert set(lines) == set(want), f"{topic}: extra {sorted(set(lines) - set(want))[:10]}"


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("client", LIST_CLIENTS)
async def test_lists_of_take_and_batches_lose_and_repeat_nothing_over_kills(
    clean_apache_kafka: ApacheKafka, reader: Client, workers: Spawn, client: str, run: int
) -> None:
    # take() and batches() fill their lists across fetched batches and commits: a
    # transaction must hold exactly the records whose list the agent has processed.
    url = url_for(clean_apache_kafka, client)
    items = item_set(9_000)
    await produce_inputs(reader, items, [], items_topic="eosl-items")
    committed = 0
    for round_ in range(3):
        worker = start(workers, f"eosl-{round_}", url, app=LISTS_APP)
        await committed_some(reader, worker, committed + 1, group="eosl")
        await asyncio.sleep(random.uniform(0.2, 0.8))
        worker.kill()
        assert worker.popen.returncode == -9
        before, committed = (
            committed,
            sum((await reader.committed("eosl", "eosl-items", PARTITIONS)).values()),
        )
        assert before < committed < len(items), (before, committed, worker.err)
    last = start(workers, "eosl-last", url, app=LISTS_APP)
    await last.wait_for_log("worker started", deadline=30)
    await until_listed(reader, items, 60, last)
    assert await last.stop() == 0, last.err
