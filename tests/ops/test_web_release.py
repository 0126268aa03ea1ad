"""A worker whose web endpoint served requests is freed once it stops: nothing of it stays
reachable from a module (aiohttp caches the middleware chain of each handler and
application, which hold the worker). A process that starts a worker again after a fatal
error (``flowkit worker`` does, after a fence) would otherwise keep every one it had."""

from __future__ import annotations

import asyncio
import gc
import weakref

from flowkit.runtime.worker import Worker
from flowkit.testing import TestDriver
from tests.ops.test_web_close import ask
from tests.ops.webapp import build


async def served_and_stopped() -> weakref.ref[Worker]:
    async with TestDriver(build("released"), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        await driver.run_until_idle()
        for path in ("/status", "/metrics", "/graph", "/health"):
            answer = await asyncio.to_thread(ask, web.port, path)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        return weakref.ref(driver.worker)


async def test_a_stopped_worker_with_an_endpoint_is_freed() -> None:
    # A task of its own, as a worker runs in: what it set in its context goes with it.
    worker = await asyncio.create_task(served_and_stopped())
    for _ in range(100):  # (a thread of the loop's executor may hold it a moment longer)
        gc.collect()
        if worker() is None:
            break
        await asyncio.sleep(0.1)
    assert worker() is None
