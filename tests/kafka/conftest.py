"""Helpers for tests that run flowkit workers as real processes against a Kafka broker.

Every worker is ``python -m flowkit.cli worker tests.kafka.apps.X:app`` started from the
repository root, with stdout and stderr in files under the test's ``tmp_path``; the
``workers`` fixture kills whatever a test left running. Every wait has a deadline.

The broker is ``kafka_server``, parametrized: ``tansu`` (a Tansu of the test's own, in
memory, ``fresh_kafka``) and ``apache-kafka`` (the session's Apache Kafka, emptied of topics
and groups after the test, ``clean_apache_kafka``; marked ``apache_kafka``). Both have
``bootstrap``, ``url``, ``start()``, ``stop()`` (SIGKILL) and ``restart()``; a restart of
Apache Kafka keeps its data, one of Tansu in memory loses it. A test narrows the params with
``@ON_TANSU`` or ``@ON_APACHE_KAFKA``; tests/README.md says which test runs where and why.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from flowkit.records import Message, TopicPartition
from flowkit.transports import Ack, read_to_end, transport_from_url
from flowkit.transports.kafka import KafkaConsumer
from tests.apache_kafka import ApacheKafka
from tests.kafka_broker import TansuBroker

# The modules in apps/ are apps for worker processes, not tests or doctests.
collect_ignore_glob = ["apps/*.py"]

REPO = Path(__file__).resolve().parents[2]

KafkaServer = TansuBroker | ApacheKafka

TANSU = pytest.param("tansu")
APACHE_KAFKA = pytest.param("apache-kafka", marks=pytest.mark.apache_kafka)
ON_TANSU = pytest.mark.parametrize("kafka_server", [TANSU], indirect=True)
ON_APACHE_KAFKA = pytest.mark.parametrize("kafka_server", [APACHE_KAFKA], indirect=True)


@pytest.fixture(params=[TANSU, APACHE_KAFKA])
def kafka_server(request: pytest.FixtureRequest) -> KafkaServer:
    """The test's broker: a Tansu of its own, or the session's Apache Kafka to itself."""
    if request.param == "tansu":
        tansu: TansuBroker = request.getfixturevalue("fresh_kafka")
        return tansu
    apache: ApacheKafka = request.getfixturevalue("clean_apache_kafka")
    return apache


# Short group timeouts: a kill -9'd member is taken over after about the session timeout
# (plus, on Tansu, its join wait of half of it: docs/kafka.md); Tansu rebalances in 1-3 s.
CLIENT_SETTINGS: dict[str, Any] = {
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 400,
    "fetch_max_wait_ms": 20,
}

SUMMARY = re.compile(r"^processed (\d+) records in [\d.]+ s", re.MULTILINE)
ASSIGNED = re.compile(r"partitions assigned +partitions=\[([^\]]*)\]")


def broker_url(bootstrap: str, **settings: Any) -> str:
    """``kafka://bootstrap?...`` with the test client settings (and ``settings``)."""
    return f"kafka://{bootstrap}?{urlencode({**CLIENT_SETTINGS, **settings})}"


async def until(
    predicate: Callable[[], bool], deadline: float, what: str, *, step: float = 0.05
) -> None:
    """Poll ``predicate`` until it holds; fail after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline} s waiting for {what}")
        await asyncio.sleep(step)


class WorkerProcess:
    """One ``flowkit worker`` child process; its output goes to ``<name>.out/.err``."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.out_path = log_dir / f"{name}.out"
        self.err_path = log_dir / f"{name}.err"
        env = {k: v for k, v in os.environ.items() if k != "FLOWKIT_BROKER"}
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "flowkit.cli", *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.popen.poll() is None

    async def wait_for_log(self, pattern: str, deadline: float = 20.0) -> re.Match[str]:
        """The first match of ``pattern`` in stderr; fails if the worker exits first."""
        regex = re.compile(pattern)
        end = time.monotonic() + deadline
        while True:
            match = regex.search(self.err)
            if match:
                return match
            if not self.running():
                match = regex.search(self.err)
                if match:
                    return match
                pytest.fail(
                    f"{self.name} exited ({self.popen.returncode}) before logging "
                    f"{pattern!r}:\n{self.err}"
                )
            if time.monotonic() > end:
                pytest.fail(f"{self.name}: no {pattern!r} after {deadline} s:\n{self.err}")
            await asyncio.sleep(0.05)

    def assigned(self) -> list[set[str]]:
        """Every assignment the worker logged, in order ("topic/partition" strings)."""
        return [
            {p.strip().strip("'\"") for p in m[1].split(",") if p.strip()}
            for m in ASSIGNED.finditer(self.err)
        ]

    async def wait(self, deadline: float) -> int:
        """The exit code, waiting at most ``deadline`` seconds."""
        end = time.monotonic() + deadline
        while self.running():
            if time.monotonic() > end:
                pytest.fail(f"{self.name} still running after {deadline} s:\n{self.err}")
            await asyncio.sleep(0.05)
        return self.popen.returncode

    async def stop(self, deadline: float = 20.0) -> int:
        """SIGTERM (a graceful stop), then the exit code."""
        if self.running():
            self.popen.send_signal(signal.SIGTERM)
        return await self.wait(deadline)

    def kill(self) -> None:
        """SIGKILL this process (and only it) and reap it."""
        if self.running():
            self.popen.kill()
        self.popen.wait(timeout=10)

    def processed(self) -> int:
        """Records processed, from the summary line a stopped worker prints."""
        match = SUMMARY.search(self.err)
        assert match is not None, f"{self.name} printed no summary:\n{self.err}"
        return int(match[1])


Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Spawn]:
    """``workers(name, "worker", app, "--broker", url, ...)`` starts a ``flowkit`` process;
    every process started is killed at the end of the test."""
    started: list[WorkerProcess] = []

    def spawn(name: str, *args: str) -> WorkerProcess:
        process = WorkerProcess(name, args, tmp_path)
        started.append(process)
        return process

    try:
        yield spawn
    finally:
        for process in started:
            process.kill()


def start_worker(spawn: Spawn, name: str, app: str, url: str) -> WorkerProcess:
    return spawn(name, "worker", app, "--broker", url, "--log-level", "info")


# -- broker access from the test ------------------------------------------------------------


class Client:
    """The test's own view of the broker: produce, read whole topics, committed offsets."""

    def __init__(self, bootstrap: str, **settings: Any) -> None:
        self.transport = transport_from_url(broker_url(bootstrap, **{"linger_ms": 2, **settings}))

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def produce(
        self, topic: str, records: Iterable[tuple[bytes | None, bytes, int | None]]
    ) -> list[Ack]:
        """Send (key, value, timestamp_ms) records; their acks, in order."""
        producer = self.transport.producer(client_id="test-producer")
        await producer.start()
        try:
            pending = [
                await producer.send(topic, value, key=key, timestamp_ms=ts)
                for key, value, ts in records
            ]
            return [await ack for ack in pending]
        finally:
            await producer.aclose()

    async def read(self, topic: str, partitions: int, deadline: float = 10.0) -> list[Message]:
        """Every record of ``topic`` now, up to the high watermark each fetch reports."""
        consumer = self.transport.consumer(group_id=None, client_id="test-reader")
        await consumer.start()
        try:
            tps = {TopicPartition(topic, p) for p in range(partitions)}
            consumer.assign(tps)
            out: list[Message] = []
            try:
                async with asyncio.timeout(deadline):
                    await read_to_end(consumer, tps, lambda _, messages: out.extend(messages))
            except TimeoutError:
                pytest.fail(f"could not read {topic} to its end in {deadline} s")
            return out
        finally:
            await consumer.aclose()

    async def follow(
        self, topic: str, partitions: int, done: Callable[[list[Message]], bool], deadline: float
    ) -> list[Message]:
        """Read ``topic`` as records arrive until ``done(records so far)``."""
        consumer = self.transport.consumer(group_id=None, client_id="test-follower")
        await consumer.start()
        try:
            consumer.assign({TopicPartition(topic, p) for p in range(partitions)})
            out: list[Message] = []
            end = time.monotonic() + deadline
            while not done(out):
                if time.monotonic() > end:
                    pytest.fail(f"{topic}: condition not met after {deadline} s ({len(out)} read)")
                for messages in (await consumer.getmany(0.1, 10_000)).values():
                    out.extend(messages)
            return out
        finally:
            await consumer.aclose()

    async def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offset per partition (0 where nothing is committed)."""
        consumer = self.transport.consumer(group_id=group, client_id="test-offsets")
        assert isinstance(consumer, KafkaConsumer)  # committed() is not in the protocol
        try:
            return {
                p: await consumer.committed(TopicPartition(topic, p)) or 0
                for p in range(partitions)
            }
        finally:
            await consumer.aclose()

    async def wait_committed(
        self, group: str, topic: str, target: dict[int, int], deadline: float
    ) -> dict[int, int]:
        """Poll the group's offsets until each partition reached ``target``."""
        end = time.monotonic() + deadline
        while True:
            offsets = await self.committed(group, topic, len(target))
            if all(offsets[p] >= target[p] for p in target):
                return offsets
            if time.monotonic() > end:
                pytest.fail(f"committed {offsets}, wanted {target}, after {deadline} s")
            await asyncio.sleep(0.1)

    async def partition_count(self, topic: str) -> int | None:
        return await self.transport.partition_count(topic)


@pytest.fixture
async def client(kafka_server: KafkaServer) -> AsyncIterator[Client]:
    """A client of this test's broker (``kafka_server``)."""
    c = Client(kafka_server.bootstrap)
    try:
        yield c
    finally:
        await c.aclose()


def end_offsets(acks: Iterable[Ack], partitions: int) -> dict[int, int]:
    """The offset after the last acknowledged record, per partition."""
    ends = dict.fromkeys(range(partitions), 0)
    for ack in acks:
        ends[ack.partition] = max(ends[ack.partition], ack.offset + 1)
    return ends


def latest_by_key(messages: Iterable[Message]) -> dict[bytes, bytes | None]:
    """A changelog as a dict: the last value per key (Tansu does not compact; Apache Kafka
    compacts only rolled segments, never the active one)."""
    out: dict[bytes, bytes | None] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        if m.key is not None:
            out[m.key] = m.value
    return out
