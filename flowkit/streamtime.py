"""Stream time, and the one guard that keeps a wrong clock out of it.

A partition's *stream time* is the largest event time read on it. Windowed tables close
windows on it (their watermark is stream time minus ``grace``) and stream-stream joins
close and expire their windows on it. It never moves back, and it is kept in the
changelog, so it survives a restart.

That makes one wrong clock expensive: a record stamped in the year 2100 would move stream
time to 2100, close every window at once, and make every later record of its partition
late, for good. So every consumer of stream time keeps the same rule, stated here:

    An event time more than ``max_future`` (1 hour by default) ahead of the worker's
    wall clock is bad input. The record raises ``FutureRecord``, so it goes to the
    dead-letter topic, and stream time stays where it was.

It holds for every record, keyed or not, and for what a restart reads back: a stored
stream time beyond the guard is not trusted (one log line says so).

>>> guard = FutureGuard(3_600_000, now_ms=lambda: 1_700_000_000_000, owner="join 'paid'")
>>> guard.admits(1_700_000_000_000 + 3_600_000), guard.admits(4_102_444_800_000)
(True, False)
>>> try:
...     guard.check_future(4_102_444_800_000)  # 2100-01-01
... except FutureRecord as e:
...     print(e)  # doctest: +NORMALIZE_WHITESPACE
event time 2100-01-01 00:00:00 UTC (4102444800000 ms) is more than max_future=3600 s
ahead of the wall clock; join 'paid' does not let it move stream time
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import structlog

from .durations import Seconds, seconds
from .errors import DefinitionError, FutureRecord

__all__ = ["DEFAULT_MAX_FUTURE", "FutureGuard", "max_future_ms", "utc"]

log = structlog.get_logger(__name__)

DEFAULT_MAX_FUTURE = 3600.0
"""Seconds an event time may be ahead of the wall clock, unless ``max_future=`` says."""

_BELOW_ALL = -(2**62)  # below every real event time
_NEVER = 2**62  # max_future=inf: the guard is off


def utc(ms: int) -> str:
    """``ms`` since the epoch as a UTC time, for people (milliseconds only when not 0).

    >>> utc(1_700_000_000_000), utc(1_700_000_000_250), utc(2**62)
    ('2023-11-14 22:13:20', '2023-11-14 22:13:20.250', 'after 9999-12-31')
    """
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):  # a record's timestamp is any int64
        return "after 9999-12-31" if ms > 0 else "before 0001-01-01"
    text = f"{when:%Y-%m-%d %H:%M:%S}"
    return text if ms % 1000 == 0 else f"{text}.{ms % 1000:03d}"


def max_future_ms(value: Seconds, what: str) -> int:
    """``max_future`` (seconds or a ``timedelta``, > 0; ``inf`` turns the guard off) in
    milliseconds; a ``DefinitionError`` naming ``what`` otherwise.

    >>> max_future_ms(3600, "window"), max_future_ms(float("inf"), "window") == 2**62
    (3600000, True)
    """
    s = seconds(value, f"{what} max_future")
    if not s > 0:
        raise DefinitionError(f"{what} max_future must be > 0 seconds, not {s:g}")
    return _NEVER if s == float("inf") else round(s * 1000)


class FutureGuard:
    """The rule above, for one table or join: what may move its stream time.

    ``future_limit`` is the latest event time allowed, cached: callers compare with it
    where they read the time anyway (one integer comparison per record) and call
    ``admits`` or ``check_future`` only past it. A stale limit is lower than the true
    one, so it never lets a bad time through; passing it reads the wall clock again.
    """

    def __init__(self, max_future_ms: int, *, now_ms: Callable[[], int], owner: str) -> None:
        self.max_future_ms = max_future_ms
        self.now_ms = now_ms
        self.owner = owner  # "table 'counts'", "join 'paid'": for the messages
        self.future_limit = _BELOW_ALL  # refreshed from the wall clock on first use

    def admits(self, ts: int) -> bool:
        """True when event time ``ts`` may move stream time (the limit is refreshed)."""
        self.future_limit = self.now_ms() + self.max_future_ms
        return ts <= self.future_limit

    def check_future(self, ts: int) -> None:
        """Raise ``FutureRecord`` when ``ts`` may not move stream time."""
        if not self.admits(ts):
            raise self.future_record(ts)

    def future_record(self, ts: int) -> FutureRecord:
        """The error of a record at ``ts``, beyond the guard."""
        return FutureRecord(
            f"event time {utc(ts)} UTC ({ts} ms) is more than max_future="
            f"{self.max_future_ms / 1000:g} s ahead of the wall clock; {self.owner} "
            "does not let it move stream time"
        )

    def trusts(self, stored: int, partition: int) -> bool:
        """Whether a stream time read back from the changelog is within the guard. One
        that is not was written by an older version, or under a wrong clock: the caller
        starts that partition's stream time again, and this logs one line saying so."""
        if stored <= self.now_ms() + self.max_future_ms:
            return True
        log.warning(
            "stream time in the changelog is beyond max_future; not trusted, it starts again",
            owner=self.owner,
            partition=partition,
            stored=f"{utc(stored)} UTC ({stored} ms)",
            max_future=self.max_future_ms / 1000,
        )
        return False
