"""The web endpoint's gate: a process of its own refuses the connections past the limit,
ends with its worker however the worker ends, and if it dies the worker's loop takes over."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from flowkit.runtime.web_limits import WebLimits
from flowkit.testing import TestDriver
from tests.local_servers import free_port, kill, listening, spawn, wait_ready
from tests.ops.test_web_limits import exchange, get
from tests.ops.webapp import build


async def test_connections_past_the_limit_never_reach_the_worker() -> None:
    limits = WebLimits(max_connections=3)
    async with TestDriver(build("gatedemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        idle = [await asyncio.open_connection("127.0.0.1", web.port) for _ in range(3)]
        async with asyncio.timeout(10):
            while len(web.listener.connections) < 3:
                await asyncio.sleep(0.01)
        answers = [await exchange(web.port, get("/status")) for _ in range(30)]
        health = await exchange(web.port, get("/health"))
        assert all(a.startswith(b"HTTP/1.1 503") and b"too many connections" in a for a in answers)
        assert health.startswith(b"HTTP/1.1 200") and b'"alive": true' in health
        # the worker made a connection of the first three only, and refused none itself
        assert (web.listener.admitted, web.listener.refused) == (3, 0)
        for _, writer in idle:
            writer.close()
        async with asyncio.timeout(10):  # their places are the next clients'
            while not (await exchange(web.port, get("/status"))).startswith(b"HTTP/1.1 200"):
                await asyncio.sleep(0.05)


async def test_the_worker_accepts_itself_once_its_gate_died() -> None:
    async with TestDriver(build("gatelessdemo"), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        gate = web.listener._gate
        assert gate is not None
        os.kill(gate.pid, signal.SIGKILL)
        async with asyncio.timeout(10):
            while web.listener._accepting is None:
                await asyncio.sleep(0.01)
        assert (await exchange(web.port, get("/status"))).startswith(b"HTTP/1.1 200")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(n) for n in (task / "children").read_text().split()]
    return found


def alive(pid: int) -> bool:
    try:  # a zombie has no command line: it is gone but for its exit status
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""
    except OSError:
        return False


async def test_the_gate_ends_when_its_worker_is_killed(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "flowkit.cli", "worker", "tests.ops.cli_app:app", "--web-port"]
    env = {"PYTHONPATH": os.getcwd()}
    worker = spawn([*cmd, str(port)], tmp_path / "worker.log", env=env)
    gates: list[int] = []
    try:
        assert await asyncio.to_thread(wait_ready, worker, lambda: listening(port), 30)
        end = time.monotonic() + 10  # (the port listens a moment before the gate starts)
        while not (gates := [pid for pid in children(worker.pid) if alive(pid)]):
            assert time.monotonic() < end, "no gate"
            await asyncio.sleep(0.02)
        assert len(gates) == 1, gates
        worker.kill()  # SIGKILL: nothing of the worker runs to stop its gate
        await asyncio.to_thread(worker.wait, 30)
        end = time.monotonic() + 10
        while alive(gates[0]):
            assert time.monotonic() < end, "the gate outlived its worker"
            await asyncio.sleep(0.02)
        assert not listening(port)
    finally:
        kill(worker)
        for pid in gates:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
