"""The app's startup and shutdown hooks, run by the worker in declaration order.

Each hook runs as a task of the worker, in its context, so ``topic.send()`` and table
reads work inside it as in a timer. A startup hook that raises stops the start
(``TaskFailed``, exit 1): the worker does not run half set up. A shutdown hook that
raises, or outlives the shutdown timeout, is logged and the next one runs: shutting down
goes on, and the final commit still happens.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from ...errors import TaskFailed

__all__ = ["run_shutdown_hooks", "run_startup_hooks"]

log = structlog.get_logger(__name__)

Hook = Callable[[], Coroutine[Any, Any, Any]]


async def run_startup_hooks(hooks: Sequence[Hook], context: contextvars.Context) -> None:
    """Run each hook to its end, in order; the first that raises stops the start."""
    for hook in hooks:
        name = getattr(hook, "__name__", repr(hook))
        try:
            await _in_context(hook, context, f"on_startup:{name}")
        except Exception as exc:
            raise TaskFailed(f"startup hook {name!r} failed: {exc!r}") from exc


async def run_shutdown_hooks(
    hooks: Sequence[Hook], context: contextvars.Context, timeout: float
) -> None:
    """Run each hook, in order, for at most ``timeout`` seconds each; log failures."""
    for hook in hooks:
        name = getattr(hook, "__name__", repr(hook))
        try:
            await asyncio.wait_for(_in_context(hook, context, f"on_shutdown:{name}"), timeout)
        except TimeoutError:
            log.error("shutdown hook timed out", hook=name, timeout=timeout)
        except Exception as exc:
            log.error("shutdown hook failed", hook=name, error=repr(exc))


async def _in_context(hook: Hook, context: contextvars.Context, name: str) -> None:
    task = asyncio.get_running_loop().create_task(hook(), name=name, context=context.copy())
    await task
