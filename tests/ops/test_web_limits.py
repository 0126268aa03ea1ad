"""The web endpoint within its limits: connections, slow headers, request rate, bodies,
and what garbage and a lack of file descriptors write to the log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from flowkit.runtime.observe.server_logs import ServerLogs
from flowkit.runtime.web.limits import WebLimits
from flowkit.testing import TestDriver
from tests.local_servers import free_port, kill, listening, spawn, wait_ready
from tests.ops.webapp import build


async def exchange(port: int, request: bytes, deadline: float = 10.0) -> bytes:
    """Send ``request`` on a new connection; all it gets back until the server closes."""
    async with asyncio.timeout(deadline):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()
        except ConnectionResetError:
            return b""
        finally:
            writer.close()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()


async def hold(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that holds a place: it began a request (one that has said nothing
    is not accepted yet, and holds none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /status HTTP/1.1\r\n")
    return reader, writer


async def fill(web: Any, places: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``places`` connections that begin a request and hold it, once the worker's listener
    counts them all (the places of a limit of ``places``)."""
    idle = [await hold(web.port) for _ in range(places)]
    async with asyncio.timeout(10):
        while len(web.listener.connections) < places:
            await asyncio.sleep(0.01)
    return idle


async def test_connections_past_the_limit_are_answered_at_once() -> None:
    limits = WebLimits(max_connections=3)
    async with TestDriver(build("fulldemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        idle = await fill(web, 3)
        busy = await exchange(web.port, get("/status"))
        assert busy.startswith(b"HTTP/1.1 503") and b"too many connections" in busy
        health = await exchange(web.port, get("/health"))
        assert health.startswith(b"HTTP/1.1 200") and b'"alive": true' in health
        async with asyncio.timeout(10):  # (the gate has the worker's answer within 0.1 s)
            while not (await exchange(web.port, get("/ready?x=1"))).startswith(b"HTTP/1.1 200"):
                await asyncio.sleep(0.02)
        for _, writer in idle:
            writer.close()
        async with asyncio.timeout(10):  # their places are free again
            while not (await exchange(web.port, get("/status"))).startswith(b"HTTP/1.1 200"):
                await asyncio.sleep(0.05)


async def test_a_connection_that_says_nothing_holds_no_place() -> None:
    limits = WebLimits(max_connections=2)
    async with TestDriver(build("silentdemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        silent = [await asyncio.open_connection("127.0.0.1", web.port) for _ in range(20)]
        assert (await exchange(web.port, get("/status"))).startswith(b"HTTP/1.1 200")
        assert web.listener.admitted == 1
        for _, writer in silent:
            writer.close()


async def test_a_slow_sender_is_closed_after_the_header_timeout() -> None:
    limits = WebLimits(header_timeout=0.3)
    async with TestDriver(build("slowdemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        # half a request, then nothing: closed without an answer
        assert await exchange(web.port, b"GET /status HTTP/1.1\r\nHost: 127") == b""
        # an answer, then an idle keep-alive: closed too
        reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
        writer.write(b"GET /graph HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200")
        assert web.listener.timeouts == 2


async def test_requests_past_the_rate_wait_then_are_refused_and_probes_pass() -> None:
    limits = WebLimits(rate=2.0, burst=1, max_wait=0.2)
    async with TestDriver(build("ratedemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        async with aiohttp.ClientSession() as http:

            async def status_of(path: str) -> int:
                async with http.get(web.url + path) as response:
                    return response.status

            statuses = await asyncio.gather(*(status_of("/status") for _ in range(10)))
            probes = await asyncio.gather(*(status_of("/health") for _ in range(20)))
        assert statuses.count(200) >= 1 and statuses.count(503) >= 5
        assert set(probes) == {200}


async def test_a_body_over_the_limit_is_413() -> None:
    limits = WebLimits(max_body=1000)
    async with TestDriver(build("bodydemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        request = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n"
        assert (await exchange(web.port, request)).startswith(b"HTTP/1.1 413")


def test_server_logs_write_no_secret() -> None:
    logs = ServerLogs(["hunter2-token"])
    assert logs._clean("bad header: Bearer hunter2-token\nnext") == "bad header: Bearer *** next"


async def probe(port: int) -> bytes:
    try:
        return await exchange(port, get("/health"))
    except OSError:
        return b""


# The worker of the next test, with 256 file descriptors (as the operator's test had).
LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
    "sys.argv = ['flowkit'] + sys.argv[1:]; "
    "runpy.run_module('flowkit.cli', run_name='__main__')"
)


async def test_half_sent_requests_and_garbage_with_few_file_descriptors(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "worker.log"
    cmd = [sys.executable, "-c", LIMITED, "worker", "tests.ops.cli_app:app"]
    cmd += ["--web-port", str(port), "--log-format", "json"]
    worker = spawn(cmd, log_path, env={"PYTHONPATH": os.getcwd()})
    try:
        assert await asyncio.to_thread(wait_ready, worker, lambda: listening(port), 30)
        # 300 connections that send half a request and wait: more than the process has
        # file descriptors for, were each kept (those past the limit are reset)
        half = []
        for _ in range(300):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            except OSError:
                continue
            half.append((reader, writer))
        # the worker still answers its probes (one may be reset while the places past
        # the limit are taken: an orchestrator asks again)
        end = time.monotonic() + 15
        while not (await probe(port)).startswith(b"HTTP/1.1 200 OK"):
            assert time.monotonic() < end, "/health never answered"
            await asyncio.sleep(0.1)
        for _, writer in half:
            writer.close()
        # 1,000 malformed requests
        bad = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad\x01Header: x\r\n\r\n"
        for start in range(0, 1000, 50):
            await asyncio.gather(*(exchange(port, bad) for _ in range(50)))
            del start
        assert (await exchange(port, get("/status"))).startswith(b"HTTP/1.1 200")
        worker.send_signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait, 30)
    finally:
        kill(worker)
    lines = log_path.read_text().splitlines()
    # the summary the command prints at the end is for people; everything else is JSON
    events = [json.loads(line) for line in lines if not line.startswith("processed ")]
    assert len(lines) < 40, lines
    errors = [e for e in events if e.get("event", "").startswith("Error handling request")]
    assert 1 <= len(errors) <= 5
    assert all("Traceback" not in line for line in lines)
    skipped = [e for e in events if e["event"].startswith("server log lines not written")]
    assert sum(e["lines"] for e in skipped) >= 900
