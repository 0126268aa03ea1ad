"""The endpoint's close: a connection that reached the worker's side but that its event
loop had not taken yet is answered, not reset, with a gate and without one."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

from flowkit.runtime.web.gate import Gate
from flowkit.runtime.web.limits import WebLimits
from flowkit.testing import TestDriver
from tests.ops.test_web_limits import get
from tests.ops.webapp import build

PATHS = ["/status", "/health", "/metrics", "/ready"] * 5


def ask(port: int, path: str) -> bytes:
    """A request on a fresh connection, sent at once; all it gets back (or the error)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(get(path))
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
            return answer
    except OSError as exc:
        return repr(exc).encode()


async def close_with_connections_waiting(limits: WebLimits) -> list[bytes]:
    """Connect ``PATHS`` while the worker's loop is blocked, then close the endpoint before
    that loop runs again: what each connection got."""
    async with TestDriver(build("closedemo"), web_port=0, web_limits=limits) as driver:
        web = driver.worker.web
        assert web is not None
        await driver.run_until_idle()
        with ThreadPoolExecutor(len(PATHS)) as pool:
            answers = [pool.submit(ask, web.port, path) for path in PATHS]
            time.sleep(0.5)  # noqa: ASYNC251 (on purpose: they arrive, the loop is blocked)
            await web.listener.aclose()  # (before the loop runs again: nothing taken)
            return [answer.result() for answer in answers]


async def test_connections_passed_by_the_gate_and_not_taken_are_answered() -> None:
    answers = await close_with_connections_waiting(WebLimits())
    assert all(answer.startswith(b"HTTP/1.1 ") for answer in answers), answers
    for path, answer in zip(PATHS, answers, strict=True):
        if path == "/health":
            assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_without_a_gate_connections_queued_at_the_close_are_answered() -> None:
    answers = await close_with_connections_waiting(WebLimits(gate=False))
    assert all(answer.startswith(b"HTTP/1.1 ") for answer in answers), answers
    for path, answer in zip(PATHS, answers, strict=True):
        if path == "/health":
            assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_gate_that_cannot_pass_connections_answers_them() -> None:
    # The worker closed its control socket as the gate passed it connections: the gate
    # answers them itself, when it drains, instead of dropping them.
    with socket.create_server(("127.0.0.1", 0)) as listening:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gate = Gate(listening, theirs, max_connections=5, max_overflow=8, answer_life=3.0)
        gate.answers["/health"] = b"HTTP/1.1 200 OK\r\n\r\nalive", time.monotonic() + 10
        listening.setblocking(False)
        clients = [socket.create_connection(listening.getsockname()) for _ in range(3)]
        for client, path in zip(clients, ["/status", "/metrics", "/health"], strict=True):
            client.sendall(get(path))
        ours.close()
        gate._accept()
        gate.drain()
        answers = [client.recv(1024) for client in clients]
        assert [a[:12] for a in answers[:2]] == [b"HTTP/1.1 503"] * 2, answers
        assert answers[2].endswith(b"alive"), answers
        for conn in (theirs, *clients):
            conn.close()
