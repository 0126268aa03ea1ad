"""Every background task of a worker runs under one ``Supervisor``: none fails silently.

A task that raises is a fatal error of the worker: the supervisor records the first one
and asks the worker to stop (the worker then raises it from ``run()``). Tasks that may
fail without stopping the worker (a user task with ``on_error="restart"``) handle their
own errors before they reach the supervisor. Closing cancels what is still running and
waits for it, so no task outlives its worker.

>>> import asyncio
>>> async def main():
...     stopped = []
...     sup = Supervisor(on_fatal=lambda exc, name: stopped.append((name, repr(exc))))
...     async def boom():
...         raise ValueError("x")
...     sup.spawn(boom(), "boom")
...     await asyncio.sleep(0)
...     await sup.aclose()
...     return stopped
>>> asyncio.run(main())
[('boom', "ValueError('x')")]
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

__all__ = ["Supervisor"]


class Supervisor:
    """Starts, watches and stops a worker's tasks."""

    def __init__(
        self,
        on_fatal: Callable[[BaseException, str], None],
        context: contextvars.Context | None = None,
    ) -> None:
        self._on_fatal = on_fatal
        self._context = context
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a supervised task (in a copy of the worker's context, if it has
        one: what one task sets in its context is not seen by the others)."""
        context = None if self._context is None else self._context.copy()
        task = asyncio.get_running_loop().create_task(coro, name=name, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._on_fatal(exc, task.get_name())

    def named(self, *prefixes: str) -> list[asyncio.Task[Any]]:
        """The running tasks whose names start with one of ``prefixes``."""
        return [t for t in self._tasks if t.get_name().startswith(prefixes)]

    @staticmethod
    async def cancel(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
        """Cancel ``tasks`` and wait until they have finished."""
        live = [t for t in tasks if t is not None]
        for task in live:
            task.cancel()
        await asyncio.gather(*live, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel every task still running and wait for them. Idempotent."""
        while self._tasks:
            await self.cancel(list(self._tasks))
