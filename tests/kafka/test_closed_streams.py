"""A worker whose stderr or stdout cannot be written still stops on SIGTERM and SIGINT,
commits its offsets and exits 0: a log line, a printed line or the summary that fails to
be written never stops the shutdown.

The cases are what shells and supervisors do: ``2>&-`` (stderr closed), a log shipper that
died (stderr a pipe whose reader is gone), ``2>&1 | head -4`` (both on one pipe whose
reader is gone), ``>&-`` (stdout closed). The app commits only when it stops, so the
committed offsets are those of the final commit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.kafka.conftest import ON_TANSU, REPO, Client, KafkaServer, broker_url, end_offsets

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.echo_app:app"
ITEMS, OUT, DLQ = "echo-items", "echo-out", "echo-dlq"
PARTITIONS = 4
TOTAL = 200
DEADLINE = 30.0  # seconds for the worker to exit once signalled

# How the worker's stdout and stderr are set up: the redirections of the shell that starts
# it (``sh -c 'exec ... REDIRECTIONS'``); the pipes are the test's, and it closes them.
CASES = {
    "stderr closed": "2>&-",
    "stderr reader gone": "",  # stderr a pipe whose reader the test closes
    "one pipe, reader gone (2>&1 | head -4)": "2>&1",
    "stdout closed": ">&-",
}


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for popen in started:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=10)


def spawn(url: str, case: str, log_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "FLOWKIT_BROKER"}
    env["PYTHONUNBUFFERED"] = "1"
    command = f'exec "$@" {CASES[case]}'
    argv = ["sh", "-c", command, "sh", sys.executable, "-m", "flowkit.cli", "worker", APP]
    argv += ["--broker", url, *extra]
    out = open(log_dir / "out", "wb")  # noqa: SIM115 (closed below; the child has its copy)
    stdout: int | object = subprocess.PIPE if case.startswith("one pipe") else out
    stderr: int | object = subprocess.PIPE if case == "stderr reader gone" else out
    with out:
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
        )


def close_reader(popen: subprocess.Popen[bytes]) -> None:
    """What ``head -4`` once it has its lines, or a log shipper that dies, does: the
    reading end of the pipe closes, and the worker's next write to it fails."""
    for pipe in (popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()


async def wait_processed(client: Client, popen: subprocess.Popen[bytes], deadline: float) -> None:
    """Until every item went through the agent (its output is sent)."""
    end = time.monotonic() + deadline
    while len(await client.read(OUT, PARTITIONS)) < TOTAL:
        if popen.poll() is not None:
            pytest.fail(f"the worker exited ({popen.returncode}) before processing the items")
        if time.monotonic() > end:
            pytest.fail(f"the items were not processed in {deadline} s")
        await asyncio.sleep(0.1)


async def wait_exit(popen: subprocess.Popen[bytes], deadline: float) -> int:
    end = time.monotonic() + deadline
    while popen.poll() is None:
        if time.monotonic() > end:
            pytest.fail(f"the worker did not exit {deadline} s after the signal")
        await asyncio.sleep(0.05)
    return popen.returncode


@pytest.mark.parametrize(
    ("case", "signum"),
    [
        # (one signal each: tests/cli/test_standard_streams.py sends both, on memory://)
        ("stderr closed", signal.SIGTERM),
        ("stderr reader gone", signal.SIGINT),
        ("one pipe, reader gone (2>&1 | head -4)", signal.SIGINT),
        ("stdout closed", signal.SIGTERM),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v,
)
@ON_TANSU  # (what is tested is the worker's own streams: one broker is enough)
async def test_a_signal_stops_a_worker_that_cannot_write_and_it_commits(
    kafka_server: KafkaServer,
    client: Client,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    case: str,
    signum: signal.Signals,
) -> None:
    await stop_and_check(kafka_server, client, processes, tmp_path, case, signum)


@ON_TANSU
async def test_a_signal_stops_worker_processes_that_cannot_write_and_they_commit(
    kafka_server: KafkaServer,
    client: Client,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    # --processes 2: the parent passes the signal on before it logs, its summary is lost,
    # and each child stops as a single worker does.
    case = "one pipe, reader gone (2>&1 | head -4)"
    await stop_and_check(
        kafka_server, client, processes, tmp_path, case, signal.SIGTERM, "--processes", "2"
    )


async def stop_and_check(
    broker: KafkaServer,
    client: Client,
    processes: list[subprocess.Popen[bytes]],
    log_dir: Path,
    case: str,
    signum: signal.Signals,
    *extra: str,
) -> None:
    acks = await client.produce(
        ITEMS,
        [
            (f"k{i % 8}".encode(), msgspec.json.encode({"key": f"k{i % 8}", "seq": i}), None)
            for i in range(TOTAL)
        ],
    )
    ends = end_offsets(acks, PARTITIONS)
    popen = spawn(broker_url(broker.bootstrap), case, log_dir, *extra)
    processes.append(popen)
    await wait_processed(client, popen, deadline=30)
    # Nothing is committed yet: the app commits only when it stops.
    assert await client.committed("echo", ITEMS, PARTITIONS) == dict.fromkeys(range(PARTITIONS), 0)
    close_reader(popen)

    popen.send_signal(signum)
    assert await wait_exit(popen, DEADLINE) == 0
    assert await client.committed("echo", ITEMS, PARTITIONS) == ends
    assert await client.read(DLQ, 1) == []  # no print or log line failed a record
