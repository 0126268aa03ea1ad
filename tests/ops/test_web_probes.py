"""Probes answered by the gate: ``/health`` and ``/ready`` on a fresh connection never wait
for the worker's event loop, yet say at once what the worker last said, and fail once the
loop has said nothing for the answers' life."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from flowkit.runtime.web import limits as web_limits
from flowkit.testing import TestDriver
from tests.ops.test_web_limits import get
from tests.ops.webapp import build


def timed_probe(port: int, path: str = "/health") -> tuple[float, bytes]:
    """One probe as a kubelet sends it (a fresh connection, 1 s to answer): its seconds
    and its answer (``b""`` if none came in time)."""
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
            conn.sendall(get(path))
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
    except OSError:
        answer = b""
    return time.monotonic() - start, answer


class Prober(threading.Thread):
    """Probes one after the other, for ``seconds`` from its start, into ``results``."""

    def __init__(self, port: int, seconds: float, path: str = "/health") -> None:
        super().__init__()
        self.port, self.seconds, self.path = port, seconds, path
        self.results: list[tuple[float, bytes]] = []
        self.start()

    def run(self) -> None:
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            self.results.append(timed_probe(self.port, self.path))
            time.sleep(0.05)


async def test_a_blocked_loop_still_answers_its_probes_within_a_second() -> None:
    # Within the limit: nobody else is connected. The loop is blocked for 1.5 s (a batch
    # of records, say), past a kubelet's 1 s timeout; the answers it pushed are fresh.
    async with TestDriver(build("blockeddemo"), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        await driver.run_until_idle()
        probers = [Prober(web.port, 1.2), Prober(web.port, 1.2, "/ready")]
        time.sleep(1.5)  # noqa: ASYNC251 (on purpose: the worker's event loop is blocked)
        for prober in probers:
            prober.join()
    for results in (prober.results for prober in probers):
        assert len(results) >= 5, results
        assert max(seconds for seconds, _ in results) < 1.0, results
        assert all(answer.startswith(b"HTTP/1.1 200") for _, answer in results), results


async def test_a_fatal_error_shows_in_the_next_probe() -> None:
    # The error is pushed as it happens: the loop, blocked right after, need not run again
    # for the probes to say so (nor past the limit, where the gate always answered).
    async with TestDriver(build("faileddemo"), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        await driver.run_until_idle()
        assert (await asyncio.to_thread(timed_probe, web.port))[1].startswith(b"HTTP/1.1 200")
        driver.worker._fatal(RuntimeError("boom"), "test")
        health, ready = Prober(web.port, 0.5), Prober(web.port, 0.5, "/ready")
        time.sleep(1.0)  # noqa: ASYNC251 (on purpose: the worker's event loop is blocked)
        health.join()
        ready.join()
    assert health.results and ready.results
    for _, answer in health.results:
        assert answer.startswith(b"HTTP/1.1 503") and b'"error": "boom"' in answer, answer
    for _, answer in ready.results:
        assert answer.startswith(b"HTTP/1.1 503") and b'"ready": false' in answer, answer


async def test_a_stuck_loop_fails_its_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Within the limit too: once the worker's last answer is older than its life, the
    # gate says the loop is stuck, at once, rather than pass the probe to that loop.
    monkeypatch.setattr(web_limits, "_ANSWER_LIFE", 0.6)
    monkeypatch.setattr(web_limits, "_ANSWERS_AGAIN", 0.1)
    async with TestDriver(build("stuckdemo2"), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        await driver.run_until_idle()
        assert (await asyncio.to_thread(timed_probe, web.port))[1].startswith(b"HTTP/1.1 200")
        results: list[tuple[float, bytes]] = []

        def later() -> None:
            time.sleep(0.9)  # the loop's last answer is older than its life by then
            results.append(timed_probe(web.port))
            results.append(timed_probe(web.port, "/ready"))

        thread = threading.Thread(target=later)
        thread.start()
        time.sleep(1.6)  # noqa: ASYNC251 (on purpose: the worker's event loop is stuck)
        thread.join()
        await asyncio.sleep(0.3)  # the loop runs again, and says so
        again = await asyncio.to_thread(timed_probe, web.port)
        assert again[1].startswith(b"HTTP/1.1 200"), again
    for seconds, answer in results:
        assert seconds < 0.5, results  # from the gate, not from the loop once it is back
        assert answer.startswith(b"HTTP/1.1 503") and b"not answered" in answer, answer
