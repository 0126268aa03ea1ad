"""What a task run by a worker can reach: that worker's table state, sender and clock.

An App is a declaration that several workers may run at once (two tests in one process,
a benchmark beside its baseline), so a table or topic holds no runtime state of its own.
Each worker builds a ``TaskScope`` and sets it once per task it runs (agents, timers,
tasks, hooks); ``table[key]`` and ``topic.send()`` find that worker's state through it.
An agent's scope is its ``StreamSource``, which also knows the record being processed.

>>> scope = TaskScope(stores={}, sender=None, now_ms=lambda: 0)
>>> token = enter_scope(scope)
>>> current_scope() is scope
True
>>> leave_scope(token); current_scope() is None
True
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from .errors import NotRunningError

if TYPE_CHECKING:
    from .records import Headers

__all__ = [
    "Sender",
    "TaskScope",
    "current_scope",
    "enter_scope",
    "leave_scope",
    "require_scope",
]


class Sender(Protocol):
    """What a running worker offers topics: sending encoded bytes."""

    async def send_bytes(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
        origin: object = None,
    ) -> Awaitable[Any]: ...


class TaskScope:
    """One worker's runtime state, as a task of that worker sees it.

    ``stores`` maps each table declaration to this worker's state for it; ``batch`` is
    the batch being processed (always None here; a ``StreamSource`` has one).
    """

    batch: Any = None

    def __init__(
        self, *, stores: dict[Any, Any], sender: Sender | None, now_ms: Callable[[], int]
    ) -> None:
        self.stores = stores
        self.sender = sender
        self.now_ms = now_ms

    def origin(self) -> object:
        """What caused a send made now, for the error policy should the broker refuse it:
        a task without a stream has no record (an agent's ``StreamSource`` has one)."""
        return None

    def follow(self, table: Any, store: Any) -> None:
        """Let every record this task reads move ``table``'s stream time. A task without
        a stream reads no records: only a ``StreamSource`` keeps the request."""


_SCOPE: contextvars.ContextVar[TaskScope | None] = contextvars.ContextVar(
    "flowkit_scope", default=None
)

# The context variable's own ``get``: no Python frame, since tables call it per record.
current_scope: Callable[[], TaskScope | None] = _SCOPE.get


def enter_scope(scope: TaskScope) -> contextvars.Token[TaskScope | None]:
    """Make ``scope`` the current task's (and the tasks it starts afterwards)."""
    return _SCOPE.set(scope)


def leave_scope(token: contextvars.Token[TaskScope | None]) -> None:
    """Undo ``enter_scope``."""
    _SCOPE.reset(token)


def require_scope(what: str) -> TaskScope:
    """The current scope, or a ``NotRunningError`` saying that ``what`` needs a worker."""
    scope = _SCOPE.get()
    if scope is None:
        raise NotRunningError(
            f"{what} works only inside a running worker's agents, timers and tasks "
            "(start one with `flowkit worker`, or use flowkit.testing.TestDriver)"
        )
    return scope
