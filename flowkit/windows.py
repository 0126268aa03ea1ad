"""Windows over event time: which windows a timestamp falls in, and when they close.

Pure logic on integer milliseconds, no I/O. A window ``[start, end)`` closes on a
partition when that partition's watermark (the largest event time seen there, minus
``grace``) reaches ``end``. Tumbling windows are hopping windows whose step is their size.

>>> w = TumblingWindow(10.0)
>>> w.starts(12_345)
[10000]
>>> HoppingWindow(10.0, step=5.0).starts(12_345)
[5000, 10000]
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from .durations import Seconds, seconds
from .errors import DefinitionError
from .streamtime import DEFAULT_MAX_FUTURE, max_future_ms, utc

__all__ = [
    "HoppingWindow",
    "SessionSpec",
    "SessionWindow",
    "SlidingSpec",
    "SlidingWindow",
    "TumblingWindow",
    "Window",
    "WindowResult",
    "WindowSpec",
    "utc",
]


class Window(msgspec.Struct, frozen=True, order=True):
    """One window, its bounds in milliseconds since the epoch: ``[start, end)`` for
    tumbling and hopping windows, ``[start, end]`` (both included) for session and sliding
    windows (``WindowSpec.bounds`` writes them so).

    ``str()`` shows it in UTC for people; ``start`` and ``end`` stay milliseconds for programs.

    >>> str(Window(1_700_000_000_000, 1_700_000_010_000))
    '2023-11-14 22:13:20 to 22:13:30 UTC'
    """

    start: int
    end: int

    def __str__(self) -> str:
        start, end = utc(self.start), utc(self.end)
        if start[:10] == end[:10]:
            end = end[11:]  # the same day: the time alone
        return f"{start} to {end} UTC"


class WindowResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """The value of one key in one window, as emitted to a topic: the final one when the
    window closes (``final`` true), or a running one of a table with ``emit_on="update"``
    (``final`` false; JSON leaves ``final`` out when true)."""

    key: object
    start: int
    end: int
    value: object
    final: bool = True


@dataclass(frozen=True)
class WindowSpec:
    """Size, step, grace and expiry of a window, in milliseconds.

    ``grace`` is how far behind the newest event time a record may arrive and still count.
    ``expires`` is how long a closed window's final values stay readable.
    ``max_future`` bounds how far ahead of the wall clock an event time may be: later ones
    are bad input, so one wrong clock cannot close every window at once (the rule is
    ``flowkit.streamtime``'s, shared with joins).
    """

    size_ms: int
    step_ms: int
    grace_ms: int
    expires_ms: int
    max_future_ms: int

    @property
    def requires_merge(self) -> bool:
        """True when the kind combines accumulators of one key by itself (session windows
        merging sessions), so a declared aggregation must have a ``merge``. Tumbling and
        hopping windows merge only the partials of several source partitions."""
        return False

    @property
    def kind(self) -> str:
        """``"tumbling"`` or ``"hopping"``."""
        return "tumbling" if self.step_ms == self.size_ms else "hopping"

    def starts(self, ts: int) -> list[int]:
        """Starts of the windows that contain ``ts``, oldest first."""
        step = self.step_ms
        last = ts - ts % step
        if step == self.size_ms:
            return [last]
        return list(range(last - self.size_ms + step, last + 1, step))

    def window(self, start: int) -> Window:
        """The window that starts at ``start``."""
        return Window(start, start + self.size_ms)

    def bounds(self, window: Window) -> str:
        """``window``'s bounds in milliseconds as this kind includes them: ``[start, end)``
        for tumbling and hopping windows, whose end belongs to the next window.

        >>> TumblingWindow(10).bounds(Window(0, 10_000))
        '[0, 10000)'
        """
        return f"[{window.start}, {window.end})"

    def describe(self) -> dict[str, object]:
        """The spec as graph attributes (seconds)."""
        return {
            "window": self.kind,
            "size": self.size_ms / 1000,
            "step": self.step_ms / 1000,
            "grace": self.grace_ms / 1000,
            "expires": self.expires_ms / 1000,
        }


def _ms(value: Seconds, what: str) -> int:
    s = seconds(value, f"window {what}")
    if s < 0:
        raise DefinitionError(f"window {what} must be >= 0 seconds")
    if s == float("inf"):
        return 2**62
    return round(s * 1000)


def TumblingWindow(
    size: Seconds,
    *,
    grace: Seconds | None = None,
    expires: Seconds | None = None,
    max_future: Seconds = DEFAULT_MAX_FUTURE,
) -> WindowSpec:
    """Back-to-back windows of ``size`` seconds. Every duration here is seconds or a
    ``datetime.timedelta``.

    ``grace`` defaults to one window: a replay of several partitions interleaves event
    time, and a small default grace silently drops records there. ``expires`` defaults to
    ``size + grace``.
    """
    return HoppingWindow(size, step=size, grace=grace, expires=expires, max_future=max_future)


def HoppingWindow(
    size: Seconds,
    *,
    step: Seconds,
    grace: Seconds | None = None,
    expires: Seconds | None = None,
    max_future: Seconds = DEFAULT_MAX_FUTURE,
) -> WindowSpec:
    """Windows of ``size`` seconds starting every ``step`` seconds (``size % step == 0``)."""
    size_ms, step_ms = _ms(size, "size"), _ms(step, "step")
    if size_ms <= 0 or step_ms <= 0:
        raise DefinitionError("window size and step must be > 0 seconds")
    if step_ms > size_ms or size_ms % step_ms:
        raise DefinitionError(
            f"a hopping window's size ({size_ms / 1000} s) must be a multiple of its step "
            f"({step_ms / 1000} s)"
        )
    grace_ms = size_ms if grace is None else _ms(grace, "grace")
    expires_ms = size_ms + grace_ms if expires is None else _ms(expires, "expires")
    return WindowSpec(size_ms, step_ms, grace_ms, expires_ms, max_future_ms(max_future, "window"))


@dataclass(frozen=True)
class SessionSpec(WindowSpec):
    """Gap, grace and expiry of session windows, in milliseconds (``size_ms`` and
    ``step_ms`` hold the gap, so code that reads any window spec finds numbers there).

    A session is ``[start, end]``: the times of its first and last record, both
    included, as in Kafka Streams.
    """

    @property
    def gap_ms(self) -> int:
        """The inactivity gap: records of a key closer than this share a session."""
        return self.size_ms

    @property
    def kind(self) -> str:
        """``"session"``."""
        return "session"

    @property
    def requires_merge(self) -> bool:
        """True: a record that bridges two sessions merges their accumulators."""
        return True

    def starts(self, ts: int) -> list[int]:
        """A session starts where its first record is: at ``ts`` for a new one."""
        return [ts]

    def window(self, start: int) -> Window:
        """The one-record session at ``start``."""
        return Window(start, start)

    def bounds(self, window: Window) -> str:
        """``[start, end]``: a session holds the records at both its ends."""
        return f"[{window.start}, {window.end}]"

    def describe(self) -> dict[str, object]:
        """The spec as graph attributes (seconds)."""
        return {
            "window": "session",
            "gap": self.gap_ms / 1000,
            "grace": self.grace_ms / 1000,
            "expires": self.expires_ms / 1000,
        }


def SessionWindow(
    gap: Seconds,
    *,
    grace: Seconds | None = None,
    expires: Seconds | None = None,
    max_future: Seconds = DEFAULT_MAX_FUTURE,
) -> SessionSpec:
    """Sessions: a key's records closer than ``gap`` seconds in event time form one
    session, which closes when stream time passes its end plus ``gap`` plus ``grace``.

    ``grace`` defaults to ``gap`` (a replay interleaves partitions' event times); ``expires``,
    how long a closed session stays readable, defaults to ``gap + grace``.

    >>> SessionWindow(30.0).describe()
    {'window': 'session', 'gap': 30.0, 'grace': 30.0, 'expires': 60.0}
    """
    gap_ms = _ms(gap, "gap")
    if gap_ms <= 0:
        raise DefinitionError("a session window's gap must be > 0 seconds")
    grace_ms = gap_ms if grace is None else _ms(grace, "grace")
    expires_ms = gap_ms + grace_ms if expires is None else _ms(expires, "expires")
    return SessionSpec(gap_ms, gap_ms, grace_ms, expires_ms, max_future_ms(max_future, "window"))


@dataclass(frozen=True)
class SlidingSpec(WindowSpec):
    """Size, grace and expiry of sliding windows, in milliseconds (``step_ms`` is 1: a
    window may start at any millisecond).

    A sliding window is ``[start, end]`` with ``end - start == size``, both bounds
    included, as in Kafka Streams' ``SlidingWindows``: one ends at each record (the last
    ``size`` up to it) and one starts just after each record that has a later one within
    ``size`` (the last ``size`` just after it left).
    """

    @property
    def requires_merge(self) -> bool:
        """True: a window's value is its records' values merged on the owning partition."""
        return True

    @property
    def kind(self) -> str:
        """``"sliding"``."""
        return "sliding"

    def starts(self, ts: int) -> list[int]:
        """The start of the window that ends at ``ts``."""
        return [ts - self.size_ms]

    def window(self, start: int) -> Window:
        """The window ``[start, start + size]``."""
        return Window(start, start + self.size_ms)

    def bounds(self, window: Window) -> str:
        """``[start, end]``: a sliding window includes both its ends.

        >>> SlidingWindow(10).bounds(Window(-10_000, 0))
        '[-10000, 0]'
        """
        return f"[{window.start}, {window.end}]"

    def describe(self) -> dict[str, object]:
        """The spec as graph attributes (seconds)."""
        return {
            "window": "sliding",
            "size": self.size_ms / 1000,
            "grace": self.grace_ms / 1000,
            "expires": self.expires_ms / 1000,
        }


def SlidingWindow(
    size: Seconds,
    *,
    grace: Seconds | None = None,
    expires: Seconds | None = None,
    max_future: Seconds = DEFAULT_MAX_FUTURE,
) -> SlidingSpec:
    """Sliding windows of ``size`` seconds whose bounds are set by the records: for every
    record, the window of the ``size`` before it, so "the last ``size``" is exact at each
    record. A window closes when stream time minus ``grace`` passes its end.

    ``grace`` defaults to ``size`` (a replay interleaves partitions' event times);
    ``expires``, how long a closed window's records stay readable, to ``size + grace``.

    >>> SlidingWindow(30.0, grace=5).describe()
    {'window': 'sliding', 'size': 30.0, 'grace': 5.0, 'expires': 35.0}
    """
    size_ms = _ms(size, "size")
    if size_ms <= 0:
        raise DefinitionError("a sliding window's size must be > 0 seconds")
    grace_ms = size_ms if grace is None else _ms(grace, "grace")
    expires_ms = size_ms + grace_ms if expires is None else _ms(expires, "expires")
    return SlidingSpec(size_ms, 1, grace_ms, expires_ms, max_future_ms(max_future, "window"))
