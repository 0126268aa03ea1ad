"""Durations: every parameter that takes seconds also takes a ``datetime.timedelta``.

>>> from datetime import timedelta
>>> seconds(timedelta(minutes=1), "size")
60.0
>>> seconds(2, "grace")
2.0
>>> seconds("10s", "window grace")
Traceback (most recent call last):
...
flowkit.errors.DefinitionError: window grace must be seconds (a number or timedelta), not str '10s'
"""

from __future__ import annotations

import math
from datetime import timedelta

from .errors import DefinitionError

__all__ = ["Seconds", "optional_seconds", "seconds"]

Seconds = float | timedelta
"""A duration: a number of seconds, or a ``datetime.timedelta``."""


def seconds(value: object, what: str) -> float:
    """``value`` as a number of seconds; a one-line ``DefinitionError`` naming ``what``
    for anything but a number or a ``timedelta`` (``bool`` and NaN included)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    raise DefinitionError(
        f"{what} must be seconds (a number or timedelta), not {type(value).__name__} {value!r}"
    )


def optional_seconds(value: object, what: str) -> float | None:
    """Like ``seconds``, with None kept as None (an unset or disabled duration)."""
    return None if value is None else seconds(value, what)
