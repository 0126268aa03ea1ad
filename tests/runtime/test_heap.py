"""A running worker keeps what it started with out of the cycle collector's way, and gives
it back when it stops: garbage is collected as before, only later for what came first."""

from __future__ import annotations

import contextlib
import gc
import weakref

import flowkit
from flowkit.testing import TestDriver

app = flowkit.App("heap", partitions=1)
words = app.topic("words", value_type=str)


@app.agent(words)
async def read(stream: flowkit.Stream[str]) -> None:
    async for _ in stream:
        pass


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


async def test_what_a_running_worker_started_with_is_frozen_until_the_last_one_stops() -> None:
    before = gc.get_freeze_count()
    async with contextlib.AsyncExitStack() as stack:
        gc.disable()  # no collection before the worker starts: the garbage below stays
        try:
            old = Node()
            old_ref = weakref.ref(old)
            del old  # garbage, but only a collection finds it
            first = await stack.enter_async_context(TestDriver(app))
        finally:
            gc.enable()
        running = gc.get_freeze_count()
        assert running > before
        async with TestDriver(app) as second:
            assert gc.get_freeze_count() >= running
            await second.send(words, "a")
            await second.run_until_idle()
        assert gc.get_freeze_count() >= running  # the first still runs
        new = Node()
        new_ref = weakref.ref(new)
        del new
        gc.collect()
        assert new_ref() is None  # made while running: collected as usual
        assert old_ref() is not None  # frozen with the rest of the start-up heap
        await first.send(words, "b")
        await first.run_until_idle()
    assert gc.get_freeze_count() == before
    gc.collect()
    assert old_ref() is None  # given back: collected now
