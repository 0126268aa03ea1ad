"""The web endpoint's gate: a process of its own refuses the connections past the limit,
ends with its worker however the worker ends, and if it dies the worker's loop takes over."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import socket
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowkit.runtime.web import gate as web_gate
from flowkit.runtime.web import limits as web_limits
from flowkit.runtime.web.gate import Gate
from flowkit.runtime.web.limits import WebLimits
from flowkit.testing import TestDriver
from tests.local_servers import free_port, kill, listening, spawn, wait_ready
from tests.ops.test_web_limits import exchange, fill, get, hold
from tests.ops.webapp import build


async def test_connections_past_the_limit_never_reach_the_worker() -> None:
    limits = WebLimits(max_connections=3)
    async with TestDriver(build("gatedemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        idle = await fill(web, 3)
        answers = [await exchange(web.port, get("/status")) for _ in range(30)]
        health = await exchange(web.port, get("/health"))
        assert all(a.startswith(b"HTTP/1.1 503") and b"too many connections" in a for a in answers)
        assert health.startswith(b"HTTP/1.1 200") and b'"alive": true' in health
        # the worker made a connection of the first three only, and refused none itself
        assert (web.listener.admitted, web.listener.refused) == (3, 0)
        gate = web.listener._gate
        assert gate is not None  # and the gate does not preempt the worker when it wakes
        assert os.sched_getscheduler(gate.pid) == os.SCHED_BATCH
        assert os.getpriority(os.PRIO_PROCESS, gate.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        for _, writer in idle:
            writer.close()
        async with asyncio.timeout(10):  # their places are the next clients'
            while not (await exchange(web.port, get("/status"))).startswith(b"HTTP/1.1 200"):
                await asyncio.sleep(0.05)


def test_connections_accepted_in_a_row_reach_the_worker_in_one_message() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gate = Gate(listening, theirs, max_connections=5, max_overflow=8, answer_life=3.0)
        listening.setblocking(False)
        clients = [socket.create_connection(listening.getsockname()) for _ in range(7)]
        for client in clients:
            client.sendall(get("/status"))
        gate._accept()
        message, fds, _, _ = socket.recv_fds(ours, 1024, 64)
        assert (message, len(fds), gate.held, gate.refused) == (b"c", 5, 5, 2)
        for fd in fds:  # each a connection of its own, its request waiting to be read
            with socket.socket(fileno=fd) as conn:
                assert conn.recv(1024) == get("/status")
        for client in clients[5:]:  # past the limit: answered by the gate
            assert client.recv(1024).startswith(b"HTTP/1.1 503")
        for conn in (ours, theirs, *clients):
            conn.close()


async def test_a_burst_of_connections_within_the_limit_is_served_whole() -> None:
    async with TestDriver(build("burstdemo"), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        answers = await asyncio.gather(*(exchange(web.port, get("/graph")) for _ in range(40)))
        assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
        assert web.listener.admitted == 40
        # probes are the gate's to answer: none reaches the worker
        answers = await asyncio.gather(*(exchange(web.port, get("/health")) for _ in range(40)))
        assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
        assert web.listener.admitted == 40


async def test_a_crowd_past_the_limit_is_answered_not_reset() -> None:
    limits = WebLimits(max_connections=1)
    async with TestDriver(build("crowddemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        idle = await fill(web, 1)
        # more at once than a short listen queue holds: it would overflow into SYN cookies,
        # which accept a connection before its request, and the gate resets those
        crowd = await asyncio.gather(*(exchange(web.port, get("/status")) for _ in range(400)))
        assert Counter(answer[:12] for answer in crowd) == {b"HTTP/1.1 503": 400}
        idle[0][1].close()


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


async def test_past_the_limit_a_stuck_worker_does_not_look_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web_limits, "_ANSWER_LIFE", 0.5)
    limits = WebLimits(max_connections=1)
    async with TestDriver(build("stuckdemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        _, writer = await hold(web.port)
        async with asyncio.timeout(10):
            while not (web.listener.full and await exchange(web.port, get("/health"))):
                await asyncio.sleep(0.01)
        fresh = await exchange(web.port, get("/health"))
        assert fresh.startswith(b"HTTP/1.1 200")  # past the limit, from the gate

        def probe_later() -> bytes:
            time.sleep(0.8)  # the worker's last answer is older than its life by then
            with socket.create_connection(("127.0.0.1", web.port), timeout=10) as conn:
                conn.sendall(get("/health"))
                return conn.recv(4096)

        with ThreadPoolExecutor(1) as pool:
            stale = pool.submit(probe_later)
            time.sleep(1.5)  # noqa: ASYNC251 (on purpose: the worker's event loop is stuck)
            assert stale.result(timeout=10).startswith(b"HTTP/1.1 503")
        writer.close()


def test_a_probe_is_answered_before_the_crowd_ahead_of_it_and_all_when_the_worker_ends() -> None:
    now = [0.0]  # the clock stands still: past its burst, each 503 waits for its turn
    with socket.create_server(("127.0.0.1", 0), backlog=1024) as listening:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gate = Gate(listening, theirs, 0, 8, 3.0, clock=lambda: now[0])
        gate.answers["/health"] = b"HTTP/1.1 200 OK\r\n\r\nalive", 10.0
        listening.setblocking(False)
        crowd = [socket.create_connection(listening.getsockname()) for _ in range(700)]
        for client in crowd:
            client.sendall(get("/status"))
        late = socket.create_connection(listening.getsockname())
        late.sendall(get("/health"))  # behind 700 others in the kernel's queue
        for _ in range(20):
            gate._accept()
        assert late.recv(1024).endswith(b"alive")  # at once, ahead of the crowd
        assert len(gate.queue) == 700 - 2000 // 4  # the crowd past the burst waits its turn
        gate._expire()  # those due within 10 ms go out together: one wakeup for 20
        assert 700 - 2000 // 4 - len(gate.queue) in (19, 20)
        ours.close()  # the worker is gone: the gate answers everyone, then stops listening
        gate.run()
        answers = Counter(client.recv(1024)[:12] for client in crowd)
        assert answers == {b"HTTP/1.1 503": 700}
        assert listening.fileno() == -1
        for conn in (theirs, late, *crowd):
            conn.close()


def test_the_gate_imports_the_standard_library_and_itself_only() -> None:
    # It runs as a script under ``python -I -S``: flowkit and the app are not importable
    # there, and importing them would cost the gate its quick start.
    folder = Path(web_gate.__file__).parent
    for module in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue  # its own modules
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (module, name)
