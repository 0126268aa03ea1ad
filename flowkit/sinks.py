"""Sinks: where an agent's outputs go besides topics, run concurrently with backpressure.

A ``Sink`` is any object with ``async write_batch(items)`` and ``async aclose()``; a plain
function (sync or async, taking one item) is wrapped in a ``CallableSink``. The worker runs
each sink in its own ``SinkRunner``:

* outputs queue per sink, up to ``max_pending``; a full queue makes the agent wait
  (backpressure), so a slow sink slows its agent instead of growing memory;
* a runner task writes batches of up to ``batch_size`` items, so sinks run concurrently
  and one slow or failing sink never holds up another's writes;
* a failing write is retried with backoff (``Retry``), then each item is handed to
  ``on_give_up`` with the record it came from, and the worker dead-letters it;
* ``flush()`` waits until everything queued so far is written or given up: the worker
  calls it before committing offsets (at-least-once).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import structlog

from . import arguments
from .errors import DefinitionError, PartialWrite
from .policies import Retry

__all__ = ["CallableSink", "Sink", "SinkRunner", "runner_options"]

log = structlog.get_logger(__name__)

GiveUp = Callable[["SinkRunner", list[tuple[Any, Any]], BaseException, int], Awaitable[None]]
"""Called with the runner, the (item, origin) pairs given up, the error and the attempts."""


@runtime_checkable
class Sink(Protocol):
    """An external destination for outputs, written in batches."""

    async def write_batch(self, items: list[Any]) -> None: ...

    async def aclose(self) -> None: ...


class CallableSink:
    """A function as a sink: called once per item, awaited if it returns an awaitable.

    >>> import asyncio
    >>> got = []
    >>> asyncio.run(CallableSink(got.append).write_batch([1, 2]))
    >>> got
    [1, 2]
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__qualname__", None) or type(fn).__name__

    async def write_batch(self, items: list[Any]) -> None:
        fn = self.fn
        for i, item in enumerate(items):
            try:
                result = fn(item)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                raise PartialWrite(i, exc) from exc

    async def aclose(self) -> None:
        return None


_OPTIONS = ("batch_size", "max_pending", "retry")


def runner_options(sink: Any) -> dict[str, Any]:
    """The ``runner_options`` of ``sink`` (a dict; none: ``{}``), checked: a wrong one is a
    ``DefinitionError`` naming the sink and the option."""
    options = getattr(sink, "runner_options", None)
    if options is None:
        return {}
    what = f"sink {sink_name(sink)!r}: runner_options"
    if not isinstance(options, Mapping):
        raise DefinitionError(f"{what} must be a dict, not {arguments.shown(options)}")
    for key, value in options.items():
        if key not in _OPTIONS:
            raise DefinitionError(f"{what} has no option {key!r} (it takes {', '.join(_OPTIONS)})")
        if key == "retry":
            if not isinstance(value, Retry):
                raise DefinitionError(
                    f"{what} retry must be a flowkit.Retry, not {arguments.shown(value)}"
                )
        else:
            arguments.count(value, f"{what} {key}")
    return dict(options)


def sink_name(sink: Any) -> str:
    """A readable name for a sink or function."""
    name = getattr(sink, "name", None)
    if isinstance(name, str):
        return name
    return getattr(sink, "__qualname__", None) or type(sink).__name__


class SinkRunner:
    """Queues, batches, writes and retries the outputs of one sink."""

    def __init__(
        self,
        sink: Sink,
        *,
        name: str,
        on_give_up: GiveUp,
        retry: Retry | None = None,
        max_pending: int = 1000,
        batch_size: int = 100,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``sleep`` waits between retries: real time by default, since a failing system
        needs real time to recover."""
        self.sink = sink
        self.name = name
        self.retry = retry or Retry(attempts=3, backoff=0.1, max_backoff=2.0)
        self.batch_size = batch_size
        self.max_pending = max_pending
        self._queue: asyncio.Queue[tuple[Any, Any]] = asyncio.Queue(max_pending)
        self._on_give_up = on_give_up
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._writing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.written = 0
        self.given_up = 0
        self.batches = 0  # write_batch calls, retries included
        self.retries = 0
        self.peak_pending = 0
        self.error: BaseException | None = None

    def start(self, spawn: Callable[[Any, str], asyncio.Task[None]] | None = None) -> None:
        """Start the writer task (through ``spawn(coro, name)`` if given)."""
        if self._task is None:
            name = f"sink:{self.name}"
            self._task = spawn(self._run(), name) if spawn else asyncio.create_task(self._run())

    async def submit(self, item: Any, origin: Any) -> None:
        """Queue one output; waits while ``max_pending`` outputs are queued. ``origin``
        (opaque here: the record it came from) is handed back to ``on_give_up``."""
        if self.error is not None:
            raise self.error
        self._idle.clear()
        await self._queue.put((item, origin))
        pending = self._queue.qsize()
        if pending > self.peak_pending:
            self.peak_pending = pending

    def pending(self) -> int:
        """Outputs queued or being written."""
        return self._queue.qsize() + self._writing

    async def flush(self) -> None:
        """Wait until every output queued so far is written or given up."""
        while self.pending():
            if self.error is not None:
                raise self.error
            self._idle.clear()
            await self._idle.wait()
        if self.error is not None:
            raise self.error

    async def _run(self) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while len(batch) < self.batch_size and not queue.empty():
                batch.append(queue.get_nowait())
            self._writing = len(batch)
            try:
                await self._write(batch)
            except BaseException as exc:  # on_give_up failed (the DLQ): the worker stops
                self.error = exc
                self._idle.set()
                raise
            finally:
                self._writing = 0
            if queue.empty():
                self._idle.set()

    async def _write(self, batch: list[tuple[Any, Any]]) -> None:
        attempt = 0
        while batch:
            attempt += 1
            items = [item for item, _ in batch]
            self.batches += 1
            try:
                await self.sink.write_batch(items)
                self.written += len(items)
                return
            except PartialWrite as exc:
                self.written += exc.written
                batch = batch[exc.written :]
                failed, error = batch[:1], exc.cause
                if exc.written:
                    attempt = 1  # progress: the failing item gets its own attempts
            except Exception as exc:
                failed, error = batch, exc
            if attempt >= self.retry.attempts:
                log.error(
                    "sink gave up",
                    sink=self.name,
                    items=len(failed),
                    attempts=attempt,
                    error=repr(error),
                )
                self.given_up += len(failed)
                await self._on_give_up(self, failed, error, attempt)
                batch = batch[len(failed) :]
                attempt = 0
                continue
            delay = self.retry.delay(attempt)
            self.retries += 1
            log.warning(
                "sink write failed; retrying",
                sink=self.name,
                attempt=attempt,
                delay=round(delay, 3),
                error=repr(error),
            )
            await self._sleep(delay)

    async def aclose(self) -> None:
        """Stop the writer (after ``flush``) and close the sink."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.sink.aclose()
