"""Probes through a flood: while a crowd connects again and again, every ``/health`` an
orchestrator sends is answered ``200``, up to and through the worker's stop."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time

from flowkit.runtime.web.limits import WebLimits
from flowkit.testing import TestDriver
from tests.ops.test_web_limits import fill
from tests.ops.webapp import build

CROWD = 400  # clients, each connecting again as soon as it has its answer
PROBE = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def probe(port: int) -> str:
    """One probe on a fresh connection, as a kubelet sends it: ``ok``, ``refused`` (nobody
    listens: the worker is gone) or what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(PROBE)
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return repr(exc)
    return "ok" if answer.startswith(b"HTTP/1.1 200") else repr(answer[:40])


def start_crowd(port: int, seconds: float) -> subprocess.Popen[bytes]:
    """The crowd (``tests.ops.web_crowd``), knocking once this returns."""
    command = [sys.executable, "-m", "tests.ops.web_crowd", str(port), str(CROWD), str(seconds)]
    crowd = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert crowd.stdout is not None
    assert crowd.stdout.readline() == b"up\n"
    return crowd


def prober(port: int, results: list[str], stop: threading.Event) -> None:
    while not stop.is_set() and (not results or results[-1] != "refused"):
        results.append(probe(port))
        time.sleep(0.01)


async def test_probes_get_through_a_flood_and_through_the_stop() -> None:
    # Every place is held, so the crowd and the probes are the gate's; the worker stops
    # while they knock: a probe the kernel accepted must be answered, not reset.
    limits = WebLimits(max_connections=2)
    crowd: subprocess.Popen[bytes] | None = None
    results: list[str] = []
    stop = threading.Event()
    thread: threading.Thread | None = None
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with TestDriver(build("flooddemo"), web_port=0, web_limits=limits) as driver:
            web = driver.worker.web
            assert web is not None
            idle = await fill(web, 2)
            crowd = await asyncio.to_thread(start_crowd, web.port, 8.0)
            await asyncio.sleep(1.0)  # the crowd is knocking
            thread = threading.Thread(target=prober, args=(web.port, results, stop))
            thread.start()
            await asyncio.sleep(1.0)
        await asyncio.to_thread(thread.join, 15)  # (until a probe finds nobody listening)
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        for _, writer in idle:
            writer.close()
        if crowd is not None:
            crowd.kill()
            crowd.communicate()
    answered = [r for r in results if r != "refused"]
    assert len(answered) >= 10, results
    assert set(answered) == {"ok"}, [r for r in answered if r != "ok"]


async def test_past_the_limit_a_slow_worker_still_looks_alive() -> None:
    # The worker's loop answers late (a batch of records takes a quarter of a second at a
    # time) but answers: past the limit its probes must say so, every time.
    limits = WebLimits(max_connections=1)
    async with TestDriver(build("slowdemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        idle = await fill(web, 1)
        results: list[str] = []
        stop = threading.Event()
        thread = threading.Thread(target=prober, args=(web.port, results, stop))
        thread.start()
        try:
            end = time.monotonic() + 5.0
            while time.monotonic() < end:
                time.sleep(0.25)  # noqa: ASYNC251 (on purpose: the worker's loop is slow)
                await asyncio.sleep(0)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join)
            for _, writer in idle:
                writer.close()
    assert len(results) >= 20, results
    assert set(results) == {"ok"}, [r for r in results if r != "ok"]
