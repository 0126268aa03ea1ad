"""Counting an agent instance's failures for its ``FailureGuard``, on the failure path only.

A record that goes through costs nothing here: the counter is asked only when a record
fails (after its retries, once its policy dead-letters or skips it), and tells how many
records went through since the last failure from the stream's own count of records read
(``StreamSource.reached``). It keeps the positions of the last ``failures`` failures; the
guard trips when the oldest of them is among the last ``records`` records read. Failures
that are the input's fault (``FailureGuard.ignore``) are taken out of the count of records
read, so they neither count nor break a run: ``failed`` sorts them out, or a caller that
already knows the failure's class does (``ignores``) and adds one to ``inputs`` itself,
which costs a burst of bad input a tenth of the call.

>>> from flowkit import FailureGuard
>>> from flowkit.records import Message
>>> read = iter(range(1, 10))
>>> counter = FailureCounter("a", "a", FailureGuard(failures=2, action="pause"), lambda: next(read))
>>> record = Message("t", 0, 0, 0, None, b"x")
>>> [counter.failed(ValueError("bug"), record) for _ in range(4)]   # records 1 to 4 fail
[0.0, 1.0, 2.0, 4.0]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from ...errors import TooManyFailures
from ...policies import FailureGuard
from ...records import Message

__all__ = ["FailureCounter"]

log = structlog.get_logger(__name__)


class FailureCounter:
    """The failures of one agent instance (``instance``, of the agent ``agent``), against
    its ``guard``; ``reached()`` is the instance's count of records read. ``trips``, if
    given, is called with the action each time the guard trips (the metric)."""

    __slots__ = (
        "_at",
        "_failures",
        "_ignore",
        "_pauses",
        "_reached",
        "_trips",
        "_window",
        "agent",
        "guard",
        "inputs",
        "instance",
    )

    def __init__(
        self,
        agent: str,
        instance: str,
        guard: FailureGuard,
        reached: Callable[[], int],
        trips: Callable[[str], Any] | None = None,
    ) -> None:
        self.agent = agent
        self.instance = instance
        self.guard = guard
        self._reached = reached
        self._trips = trips
        self._failures = guard.failures
        self._window = guard.window
        self._ignore = guard.ignore
        # Where the last ``failures`` failures were, in records read minus input failures.
        self._at: deque[int] = deque(maxlen=guard.failures)
        self.inputs = 0  # failures that were the input's fault, so far
        self._pauses = 0  # trips since the last failure that did not trip

    def failed(self, exc: BaseException, message: Message) -> float:
        """Count the failure of ``message`` (the record being processed): the seconds to
        pause after it is dealt with (0.0 unless the guard pauses); raises
        ``TooManyFailures`` instead when the guard stops the worker (the record is then
        neither dead-lettered nor committed)."""
        if isinstance(exc, self._ignore):
            self.inputs += 1
            return 0.0
        at = self._reached() - self.inputs
        failures = self._at
        failures.append(at)
        if len(failures) < self._failures or at - failures[0] >= self._window:
            self._pauses = 0
            return 0.0
        return self._trip(exc, message)

    def ignores(self, kind: type[BaseException]) -> bool:
        """Whether failures of the class ``kind`` are the input's fault (not counted: the
        caller adds them to ``inputs``, or lets ``failed`` do it)."""
        return issubclass(kind, self._ignore)

    def _trip(self, exc: BaseException, message: Message) -> float:
        guard = self.guard
        if self._trips is not None:
            self._trips(guard.action)
        where = f"{message.topic}/{message.partition} offset {message.offset}"
        if guard.action == "stop":
            raise TooManyFailures(
                self.agent,
                failures=self._failures,
                records=self._window,
                error=exc,
                where=where,
            )
        pause: float = guard.pause_seconds * 2**self._pauses
        if 0 < pause < guard.max_pause_seconds:
            self._pauses += 1  # (not once the longest pause is reached: 2**n stays small)
        else:
            pause = guard.max_pause_seconds
        log.warning(
            "too many records failed; pausing the agent",
            agent=self.instance,
            guard=guard.describe(),
            pause=round(pause, 3),
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            error=repr(exc),
        )
        return pause
