"""What the two Kafka clients' transports share: the value checks of their settings, the
room a dead letter needs, and the partition-count check of existing topics. Imports
neither client library, so each transport stays the only importer of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError
from .base import TopicSpec

__all__ = [
    "DEAD_LETTER_ROOM",
    "NONNEG",
    "POS",
    "SECONDS",
    "STR",
    "Check",
    "check_counts",
    "int_at_least",
    "one_of",
]

# What a dead letter adds to the record it carries: flowkit.* headers with a bounded error
# message and traceback. The producer's max_request_size defaults to the largest record the
# consumer fetches plus this, so whatever the worker reads it can also dead-letter.
DEAD_LETTER_ROOM = 64 * 1024

Check = tuple[Callable[[Any], bool], str]
"""A setting's check: a predicate and what it expects, for the error message."""


def int_at_least(low: int) -> Check:
    """An int, ``low`` or more (``True`` is not an int here)."""
    return (lambda v: type(v) is int and v >= low), f"an int >= {low}"


def one_of(*choices: object) -> Check:
    """One of ``choices``, of the same type (``1`` is not ``True``)."""
    names = ", ".join(map(repr, choices))
    return (lambda v: any(v == c and type(v) is type(c) for c in choices)), f"one of {names}"


STR: Check = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
SECONDS: Check = (lambda v: type(v) in (int, float) and v > 0, "a positive number of seconds")
POS, NONNEG = int_at_least(1), int_at_least(0)


def check_counts(specs: Iterable[TopicSpec], existing: Mapping[str, int]) -> None:
    """Raise ``ConfigurationError`` for each spec whose topic exists with another count."""
    problems = [
        f"topic {s.name!r} exists with {existing[s.name]} partitions,"
        f" the app declares {s.partitions}"
        for s in specs
        if existing.get(s.name, s.partitions) != s.partitions
    ]
    if problems:
        raise ConfigurationError("; ".join(dict.fromkeys(problems)))
