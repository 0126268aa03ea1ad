"""``flowkit worker APP --processes 2``: one parent, two worker processes, one group.

One real parent process on Apache Kafka (the test's alone), driven through the life of a group:
both children share the work exactly, the parent's ``/metrics`` sums theirs, a child
killed with ``kill -9`` is restarted and nothing is missing, and a SIGTERM to the parent
stops both gracefully with every offset committed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from tests.kafka.conftest import (
    ON_APACHE_KAFKA,
    Client,
    KafkaServer,
    Spawn,
    broker_url,
    end_offsets,
    latest_by_key,
)
from tests.kafka.test_processes import free_port
from tests.tracebacks import crashes

pytestmark = pytest.mark.kafka

APP = "tests.kafka.apps.spread_app:app"
ITEMS = "spread-items"
PARTITIONS = 4


def items(first: int, count: int) -> list[tuple[bytes, bytes, None]]:
    return [
        (f"k{i % 16}".encode(), msgspec.json.encode({"key": f"k{i % 16}", "seq": i}), None)
        for i in range(first, first + count)
    ]


async def seen_by_seq(client: Client) -> Counter[int]:
    """How many times the final table holds each sequence number."""
    seen: Counter[int] = Counter()
    for value in latest_by_key(await client.read("spread-seen-changelog", PARTITIONS)).values():
        assert value is not None
        seen.update(msgspec.json.decode(value))
    return seen


def get(url: str) -> tuple[int, str]:
    """Status and body of a GET (urllib, in a thread: the test's loop keeps running)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:
        return 0, "{}"  # not listening yet


async def aget(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, url)


async def table_read(url: str, deadline: float) -> tuple[int, dict[str, Any]]:
    """A table read that follows no redirect, asked again while it answers 404 (the
    children learn where each other's partitions are a moment after they join)."""
    end = asyncio.get_running_loop().time() + deadline
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(url, allow_redirects=False) as response:
                body = await response.json(content_type=None)
                if response.status != 404 or asyncio.get_running_loop().time() > end:
                    return response.status, body
            await asyncio.sleep(0.1)


def records_in(metrics_text: str) -> float:
    return sum(
        float(m[1])
        for m in re.finditer(r"^flowkit_records_in_total\{[^}]*\} (\S+)$", metrics_text, re.M)
    )


def environ_names(pid: int) -> set[str]:
    variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return {v.split(b"=")[0].decode() for v in variables}


def gone(path: str) -> bool:
    return not Path(path).exists()


async def ready(web: str) -> tuple[int, dict[str, Any]]:
    status, body = await aget(web + "/ready")
    return status, json.loads(body)


async def wait_ready(web: str, want: int, deadline: float) -> dict[str, Any]:
    state: dict[str, Any] = {}

    async def check() -> bool:
        nonlocal state
        status, state = await ready(web)
        return status == want

    end = asyncio.get_running_loop().time() + deadline
    while not await check():
        if asyncio.get_running_loop().time() > end:
            pytest.fail(f"/ready never answered {want} in {deadline} s: {state}")
        await asyncio.sleep(0.1)
    return state


@ON_APACHE_KAFKA
async def test_two_processes_share_the_work_survive_a_kill_and_stop_together(
    kafka_server: KafkaServer, client: Client, workers: Spawn
) -> None:
    port = free_port()
    web = f"http://127.0.0.1:{port}"
    url = broker_url(kafka_server.bootstrap)
    parent = workers(
        "parent", "worker", APP, "--broker", url, "--processes", "2", "--web-port", str(port)
    )

    # Both children joined and hold their partitions: the parent says ready.
    state = await wait_ready(web, 200, deadline=30)
    assert [p["ready"] for p in state["processes"]] == [True, True]
    pids = [p["pid"] for p in state["processes"]]
    for pid in pids:  # what may be secret came over a pipe, not in their environment
        assert not environ_names(pid) & {"FLOWKIT_BROKER", "FLOWKIT_WEB_SECRET"}

    # 1. They consume a topic to completion with exact results.
    acks = await client.produce(ITEMS, items(0, 1_500))
    await client.wait_committed("spread", ITEMS, end_offsets(acks, PARTITIONS), deadline=30)
    assert await seen_by_seq(client) == Counter(range(1_500))

    # 2. The parent's /metrics is the sum of the children's.
    status, text = await aget(web + "/metrics")
    assert status == 200
    own = [records_in((await aget(p["url"] + "/metrics"))[1]) for p in state["processes"]]
    assert records_in(text) == sum(own) == 1_500
    assert all(n > 0 for n in own), own  # both did part of the work
    assert "flowkit_consumer_lag_records" in text  # the live figures, asked of the children
    assert re.search(r"^flowkit_assigned_partitions \S+$", text, re.M)

    # 2b. Every key is answered by the parent itself, whichever child holds it: a child
    # that does not redirects to the other (their adverts signed with the secret the
    # parent gave them), and the parent asks that child.
    for n in range(16):
        key = f"k{n}"
        status, body = await table_read(web + f"/tables/seen/{key}", deadline=10)
        assert status == 200 and body["key"] == key, body

    # 3. kill -9 of one child mid-run: restarted, /ready flips, nothing is missing.
    acks += await client.produce(ITEMS, items(1_500, 2_500))
    while sum(1 for s in (await seen_by_seq(client)) if s >= 1_500) < 200:
        await asyncio.sleep(0.05)
    os.kill(pids[0], signal.SIGKILL)
    await wait_ready(web, 503, deadline=10)
    state = await wait_ready(web, 200, deadline=30)
    assert state["processes"][0]["pid"] != pids[0]
    assert state["processes"][1]["pid"] == pids[1]
    ends = end_offsets(acks, PARTITIONS)
    await client.wait_committed("spread", ITEMS, ends, deadline=30)
    seen = await seen_by_seq(client)
    assert set(seen) == set(range(4_000))  # at least once: nothing missing
    assert all(n == 1 for seq, n in seen.items() if seq < 1_500)
    died = re.findall(r"worker process died; restarting it.*", parent.err)
    assert len(died) == 1, parent.err
    assert "killed by SIGKILL" in died[0] and "process=1" in died[0], died

    # 4. SIGTERM to the parent: both stop gracefully, hooks run, offsets are committed.
    assert await parent.stop(deadline=30) == 0, parent.err
    assert parent.err.count("shutdown hook ran") == 2, parent.err
    assert await client.committed("spread", ITEMS, PARTITIONS) == ends  # nothing read twice
    summary = re.search(
        r"^processed (\d+) records in [\d.]+ s .* in 2 processes; .*$", parent.err, re.M
    )
    assert summary is not None, parent.err
    assert int(summary[1]) >= 4_000 and summary[0].endswith(", 1 restart")
    directory = re.search(r"directory=(\S+)", parent.err)
    assert directory is not None and gone(directory[1].strip("'"))
    assert not crashes(parent.err), parent.err
