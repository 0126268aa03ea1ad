"""What happens when processing a record raises: per-agent error policies.

>>> import flowkit
>>> policy = flowkit.ErrorPolicy({TimeoutError: flowkit.Retry(attempts=5), KeyError: "skip"})
>>> policy.action_for(KeyError("x"))
'skip'
>>> policy.action_for(ValueError("y"))
'dead_letter'

Actions: ``"dead_letter"`` (the default: the record goes to the dead-letter topic with
headers naming the error), ``"skip"`` (a log line and a metric, nothing else), ``"stop"``
(the worker stops; the record is not committed, so it is processed again after a
restart), or ``Retry(...)``: the record is processed again after an exponential backoff
with jitter, up to ``attempts`` times, then handled by ``then``.

A retry waits in the agent instance that owns the record's partition (records of a
partition are never reordered); other instances go on. With ``concurrency`` equal to the
number of partitions, a retrying record holds up no other partition.

Above the policy, a ``FailureGuard`` watches how many records fail: an agent that fails
on every record has a bug, and dead-lettering its whole input helps no one, so by default
the worker stops after 1,000 failures in a row.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, cast

from . import arguments
from .durations import Seconds, seconds
from .errors import DecodeError, DefinitionError, FutureRecord, LateRecord, MissingFieldError

__all__ = ["APP_DEFAULT", "INPUT_ERRORS", "Action", "ErrorPolicy", "FailureGuard", "Retry"]

Terminal = Literal["dead_letter", "skip", "stop"]
_TERMINAL = ("dead_letter", "skip", "stop")


@dataclass(frozen=True)
class Retry:
    """Process the record again, up to ``attempts`` times in all, waiting
    ``backoff * 2**(attempt-1)`` seconds (at most ``max_backoff``, +/- ``jitter``).
    ``backoff`` and ``max_backoff`` also take a ``datetime.timedelta``."""

    attempts: int = 3
    backoff: Seconds = 0.1
    max_backoff: Seconds = 10.0
    jitter: float = 0.2
    then: Terminal = "dead_letter"

    def __post_init__(self) -> None:
        # Stored as float seconds whatever was given (frozen: set through object).
        object.__setattr__(self, "backoff", seconds(self.backoff, "Retry(backoff=)"))
        object.__setattr__(self, "max_backoff", seconds(self.max_backoff, "Retry(max_backoff=)"))
        arguments.count(self.attempts, "Retry(attempts=)")
        if not isinstance(self.jitter, int | float) or isinstance(self.jitter, bool):
            raise DefinitionError(
                f"Retry(jitter=) must be a number within [0, 1], not {arguments.shown(self.jitter)}"
            )
        if self._backoff < 0 or self._max_backoff < 0 or not 0 <= self.jitter <= 1:
            raise DefinitionError("Retry backoffs must be >= 0 and jitter within [0, 1]")
        if self.then not in _TERMINAL:
            raise DefinitionError(f"Retry(then=...) must be one of {', '.join(_TERMINAL)}")

    @property
    def _backoff(self) -> float:
        return cast(float, self.backoff)  # seconds since __post_init__

    @property
    def _max_backoff(self) -> float:
        return cast(float, self.max_backoff)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 failed)."""
        base = min(self._backoff * 2 ** (attempt - 1), self._max_backoff)
        spread = base * self.jitter
        jittered: float = base + (rng or random).uniform(-spread, spread)
        return max(0.0, jittered)


Action = Union[Terminal, Retry]  # noqa: UP007 - a runtime alias, read by isinstance checks


@dataclass(frozen=True)
class ErrorPolicy:
    """Maps exception types to actions; the first matching rule wins, else ``default``."""

    rules: Mapping[type[BaseException] | tuple[type[BaseException], ...], Action] = field(
        default_factory=dict
    )
    default: Action = "dead_letter"

    def __post_init__(self) -> None:
        if not isinstance(self.rules, Mapping):
            raise DefinitionError(
                "ErrorPolicy rules must be a dict of exception type -> action, "
                f"not {arguments.shown(self.rules)}"
            )
        for kinds, action in [*self.rules.items(), (Exception, self.default)]:
            types = kinds if isinstance(kinds, tuple) else (kinds,)
            if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
                raise DefinitionError(f"error policy key {kinds!r} is not an exception type")
            if not isinstance(action, Retry) and action not in _TERMINAL:
                raise DefinitionError(
                    f"error policy action {action!r} must be 'dead_letter', 'skip', 'stop' "
                    "or flowkit.Retry(...)"
                )

    @classmethod
    def of(
        cls,
        value: ErrorPolicy
        | Mapping[type[BaseException] | tuple[type[BaseException], ...], Action]
        | None,
        what: str = "on_error",
    ) -> ErrorPolicy:
        """An ``ErrorPolicy`` from a policy, a mapping of rules, or None (the default);
        anything else is a ``DefinitionError`` naming it as ``what``."""
        if value is None:
            return cls()
        if isinstance(value, ErrorPolicy):
            return value
        if not isinstance(value, Mapping):
            raise DefinitionError(
                f"{what} must be a flowkit.ErrorPolicy or a dict of exception type -> "
                f"action, not {arguments.shown(value)}"
            )
        return cls(dict(value))

    def action_for(self, exc: BaseException) -> Action:
        """The action for ``exc``."""
        for kinds, action in self.rules.items():
            if isinstance(exc, kinds):
                return action
        return self.default

    def describe(self) -> dict[str, str]:
        """The rules as text, for the graph."""
        out = {
            (k.__name__ if isinstance(k, type) else "|".join(t.__name__ for t in k)): _show(a)
            for k, a in self.rules.items()
        }
        out["*"] = _show(self.default)
        return out


def _show(action: Action) -> str:
    if isinstance(action, Retry):
        return f"retry x{action.attempts} then {action.then}"
    return action


# Failures that are the input's fault, not the agent's: bytes that do not decode, a field
# a transform needs and the record lacks, an event time too late or too far ahead.
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    DecodeError,
    MissingFieldError,
    LateRecord,
    FutureRecord,
)


@dataclass(frozen=True)
class FailureGuard:
    """Stops the worker when an agent fails on ``failures`` of the last ``records``
    records it read (by default ``records`` is ``failures``: that many in a row).

    A failure is a record that made the agent raise and was dead-lettered or skipped by
    the error policy (after its retries, if any). Failures of types in ``ignore`` are the
    input's fault, not the agent's (by default: ``DecodeError``, ``MissingFieldError``,
    ``LateRecord``, ``FutureRecord``): they are neither counted nor let a count start
    again. ``action="pause"`` pauses the agent instance instead of stopping the worker:
    for ``pause`` seconds, twice as long at each trip that follows another, up to
    ``max_pause``; then it goes on, and trips again at its next failure unless records
    went through in between.

    >>> FailureGuard().describe()
    'stop after 1,000 failures in a row'
    >>> FailureGuard(failures=50, records=100, action="pause").describe()
    'pause after 50 failures in 100 records'
    """

    failures: int = 1000
    records: int | None = None
    action: Literal["stop", "pause"] = "stop"
    pause: Seconds = 1.0
    max_pause: Seconds = 60.0
    ignore: tuple[type[BaseException], ...] = INPUT_ERRORS

    def __post_init__(self) -> None:
        object.__setattr__(self, "pause", seconds(self.pause, "FailureGuard(pause=)"))
        object.__setattr__(self, "max_pause", seconds(self.max_pause, "FailureGuard(max_pause=)"))
        if not isinstance(self.failures, int) or self.failures < 1:
            raise DefinitionError("FailureGuard(failures=...) must be an int >= 1")
        if self.records is None:
            object.__setattr__(self, "records", self.failures)
        elif not isinstance(self.records, int) or self.records < self.failures:
            raise DefinitionError(
                "FailureGuard(records=...) must be an int >= failures: the failures are "
                "counted among the last `records` records"
            )
        if self.action not in ("stop", "pause"):
            raise DefinitionError("FailureGuard(action=...) must be 'stop' or 'pause'")
        if self.pause_seconds < 0 or self.max_pause_seconds < 0:
            raise DefinitionError("FailureGuard pause and max_pause must be >= 0")
        ignore = self.ignore if isinstance(self.ignore, tuple) else (self.ignore,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in ignore):
            raise DefinitionError("FailureGuard(ignore=...) must be a tuple of exception types")
        object.__setattr__(self, "ignore", ignore)

    @property
    def window(self) -> int:
        """How many records the failures are counted among."""
        return cast(int, self.records)  # set in __post_init__

    @property
    def pause_seconds(self) -> float:
        """``pause``, in seconds."""
        return cast(float, self.pause)

    @property
    def max_pause_seconds(self) -> float:
        """``max_pause``, in seconds."""
        return cast(float, self.max_pause)

    def describe(self) -> str:
        """The guard as text, for the graph and the logs."""
        if self.window == self.failures:
            return f"{self.action} after {self.failures:,} failures in a row"
        return f"{self.action} after {self.failures:,} failures in {self.window:,} records"

    @classmethod
    def of(cls, value: Any, where: str) -> FailureGuard | None:
        """``value`` checked: a ``FailureGuard`` or None (no guard)."""
        if value is None or isinstance(value, FailureGuard):
            return value
        raise DefinitionError(
            f"{where}: failure_guard must be a flowkit.FailureGuard(...) or None (no guard), "
            f"not {value!r}"
        )


class _AppDefault:
    """An agent's ``failure_guard`` when it sets none: the app's."""

    def __repr__(self) -> str:
        return "APP_DEFAULT"


APP_DEFAULT: Any = _AppDefault()
"""``@app.agent(failure_guard=...)``'s default: the app's ``failure_guard``."""
