"""The checks a declaration makes of its arguments: one line naming the argument.

Every entry point a user declares with (``App``, ``app.topic``, ``app.agent``, tables,
windows, joins, timers, stream operators) checks each argument's type and range where it
is given, so a wrong one is a ``DefinitionError`` that says which argument and what it
takes, instead of a Python error from deep inside, or a worker that fails later:

>>> count("4", "topic 'orders': partitions")
Traceback (most recent call last):
...
flowkit.errors.DefinitionError: topic 'orders': partitions must be an int >= 1, not str '4'
>>> name("a b", "topic name")
Traceback (most recent call last):
...
flowkit.errors.DefinitionError: topic name 'a b' may use only letters, digits, '.', '_' and '-'
>>> function(42, "stream.filter(): predicate")
Traceback (most recent call last):
...
flowkit.errors.DefinitionError: stream.filter(): predicate must be a function, not int 42

They run once per declaration (or per operator call), never per record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from .durations import seconds
from .errors import DefinitionError

__all__ = [
    "choice",
    "count",
    "flag",
    "function",
    "name",
    "non_negative_seconds",
    "optional_count",
    "shown",
    "text",
]

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def shown(value: object) -> str:
    """``value`` as an error message shows it: its type, then its repr (cut short)."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def count(value: object, what: str, *, minimum: int = 1) -> int:
    """``value``, an int (not a bool) of at least ``minimum``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    raise DefinitionError(f"{what} must be an int >= {minimum}, not {shown(value)}")


def optional_count(value: object, what: str, *, minimum: int = 1) -> int | None:
    """Like ``count``, with None kept as None (the default)."""
    return None if value is None else count(value, what, minimum=minimum)


def name(value: object, what: str) -> str:
    """A name that becomes part of a topic name: letters, digits, ``.``, ``_``, ``-``."""
    if not isinstance(value, str):
        raise DefinitionError(f"{what} must be a str, not {shown(value)}")
    if not _NAME.match(value):
        raise DefinitionError(f"{what} {value!r} may use only letters, digits, '.', '_' and '-'")
    return value


def text(value: object, what: str) -> str:
    """A non-empty str."""
    if isinstance(value, str) and value:
        return value
    raise DefinitionError(f"{what} must be a non-empty str, not {shown(value)}")


def flag(value: object, what: str) -> bool:
    """``True`` or ``False``, not a value that happens to be truthy."""
    if isinstance(value, bool):
        return value
    raise DefinitionError(f"{what} must be True or False, not {shown(value)}")


def function(value: object, what: str) -> Callable[..., Any]:
    """Something to call."""
    if callable(value):
        return value
    raise DefinitionError(f"{what} must be a function, not {shown(value)}")


def choice(value: object, what: str, choices: Iterable[str]) -> str:
    """One of ``choices``."""
    options = tuple(choices)
    if isinstance(value, str) and value in options:
        return value
    listed = ", ".join(repr(c) for c in options[:-1]) + f" or {options[-1]!r}"
    raise DefinitionError(f"{what} must be {listed}, not {shown(value)}")


def non_negative_seconds(value: object, what: str) -> float:
    """A duration (seconds or a ``timedelta``) of at least zero."""
    s = seconds(value, what)
    if s < 0:
        raise DefinitionError(f"{what} must be >= 0 seconds, not {s}")
    return s
