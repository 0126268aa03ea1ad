"""The process group's supervision and metrics merging, with small real child processes.

The children here are a few lines of Python, not workers, so restarts, signals and exit
codes are checked in a second; ``tests/kafka/test_worker_processes.py`` runs real workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from flowkit.runtime.processes.group import ProcessGroup, describe_exit
from flowkit.runtime.processes.metrics import merge_live

# Exits 3 the first time it runs in a slot (it leaves a mark), then waits for SIGTERM and
# exits 0: a child that crashes once and then runs until it is stopped.
CRASH_ONCE = """
import os, pathlib, signal, sys, time
mark = pathlib.Path(os.environ["FLOWKIT_PROCESS_DIR"], "ran-" + os.environ["FLOWKIT_PROCESS"])
if not mark.exists():
    mark.write_text("")
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(str(mark) + "-up").write_text(os.environ["PROMETHEUS_MULTIPROC_DIR"])
while True:
    time.sleep(0.05)
"""


async def test_a_child_that_dies_is_restarted_and_all_stop_on_stop() -> None:
    argv = [sys.executable, "-c", CRASH_ONCE]
    async with ProcessGroup(argv, 2, backoff=0.05) as group:
        running = asyncio.create_task(group.run())
        ups = [group.directory / f"ran-{i}-up" for i in (1, 2)]
        async with asyncio.timeout(20):
            while not all(path.exists() for path in ups):
                await asyncio.sleep(0.02)
        assert ups[0].read_text() == str(group.metrics_dir)
        assert [child.exits for child in group.children] == [[3], [3]]
        assert [child.restarts for child in group.children] == [1, 1]
        pids = [child.pid for child in group.children]
        assert all(pids)
        group.stop()  # one SIGTERM each
        assert await asyncio.wait_for(running, 20) == 0
        assert [child.exits for child in group.children] == [[3, 0], [3, 0]]
        assert group.failures() == []
        directory = group.directory
    assert not directory.exists()  # the group's directory (and its metrics) is removed


async def test_a_child_that_refuses_its_input_stops_the_group() -> None:
    argv = [sys.executable, "-c", "import sys; sys.exit(2)"]
    async with ProcessGroup(argv, 2, backoff=0.05) as group:
        assert await asyncio.wait_for(group.run(), 20) == 2
        assert group.failed is not None and "exit code 2" in group.failed
        assert all(child.restarts == 0 for child in group.children)


def test_exits_are_described_by_code_or_signal() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-9) == "killed by SIGKILL"


def _text(lag: dict[str, float], pending: float) -> str:
    registry = CollectorRegistry()
    gauge = Gauge("flowkit_consumer_lag_records", "lag", ["partition"], registry=registry)
    for partition, value in lag.items():
        gauge.labels(partition).set(value)
    Gauge("flowkit_sink_pending", "pending", registry=registry).set(pending)
    Counter("flowkit_changelog_records", "written", registry=registry).inc(pending)
    return generate_latest(registry).decode()


def test_live_figures_are_summed_except_a_partition_held_twice() -> None:
    one = _text({"0": 5, "1": 7}, pending=2)
    two = _text({"1": 9, "2": 1}, pending=3)  # partition 1 reported by both mid-rebalance
    merged = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in merge_live([one, two])
        for s in family.samples
    }
    lag = "flowkit_consumer_lag_records"
    assert merged[lag, (("partition", "0"),)] == 5
    assert merged[lag, (("partition", "1"),)] == 9  # the higher, not 16
    assert merged[lag, (("partition", "2"),)] == 1
    assert merged["flowkit_sink_pending", ()] == 5
    assert merged["flowkit_changelog_records_total", ()] == 5


def test_the_group_owns_its_directory() -> None:
    group = ProcessGroup(["true"], 1, env={"PATH": os.environ["PATH"]})
    try:
        assert group.metrics_dir.is_dir() and group.metrics_dir.parent == group.directory
        assert group.children[0].url() is None  # nothing reported yet
    finally:
        asyncio.run(group.aclose())
    assert not group.directory.exists()


async def test_a_child_that_stops_by_itself_is_not_restarted() -> None:
    # As a worker does when its standard output closes (``| head``): status 0, unasked.
    argv = [sys.executable, "-c", "pass"]
    async with ProcessGroup(argv, 2, backoff=0.05) as group:
        assert await asyncio.wait_for(group.run(), 20) == 0
        assert [child.exits for child in group.children] == [[0], [0]]
        assert all(child.restarts == 0 for child in group.children)


# Reads its secrets twice, and starts a process that looks for their pipe.
SECRETS = """
import json, os, pathlib, subprocess
from flowkit.runtime.lifecycle.secrets import inherited_secrets
first, again = inherited_secrets(), inherited_secrets()
look = "echo ${FLOWKIT_PROCESS_SECRETS_FD-none}"
below = subprocess.run(["sh", "-c", look], capture_output=True, text=True).stdout.strip()
out = pathlib.Path(os.environ["FLOWKIT_PROCESS_DIR"], "secrets")
out.write_text(json.dumps([first, again, below]))
"""


async def test_secrets_reach_the_child_once_and_no_further() -> None:
    argv = [sys.executable, "-c", SECRETS]
    secrets = {"FLOWKIT_WEB_TOKEN": "t0ken-4411"}
    async with ProcessGroup(argv, 1, secrets=secrets) as group:
        async with asyncio.timeout(60):
            assert await group.run() == 0
        seen = json.loads((group.directory / "secrets").read_text())
        assert seen == [secrets, secrets, "none"]
