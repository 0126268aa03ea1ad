"""A budget of log lines per kind: a burst of failing records logs a few lines, not one each.

A stream of 100,000 bad records at full speed would write 100,000 error lines: most of
the time they cost, and noise that hides the first one. ``LogBudget`` lets through the
first ``burst`` lines of each kind (an agent's failures, say) per ``interval`` seconds
and counts the rest; ``summary`` returns those counts once, for one line each at the next
checkpoint. Every record still has its metric and its dead letter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LogBudget"]


class LogBudget:
    """Up to ``burst`` log lines per kind per ``interval`` seconds of ``monotonic``.

    >>> now = [0.0]
    >>> budget = LogBudget(lambda: now[0], burst=2, interval=10.0)
    >>> [budget.allow("a") for _ in range(4)]
    [True, True, False, False]
    >>> budget.summary()
    {'a': 2}
    >>> now[0] = 10.0
    >>> budget.allow("a"), budget.summary()
    (True, {})
    """

    def __init__(
        self, monotonic: Callable[[], float], *, burst: int = 20, interval: float = 10.0
    ) -> None:
        self._monotonic = monotonic
        self.burst = burst
        self.interval = interval
        # kind -> [window start, lines logged in it, lines not logged since ``summary``]:
        # changed in place, so a line of a burst costs a clock reading, one lookup and a
        # count, no tuple made and no second dict.
        self._windows: dict[str, list[Any]] = {}

    def allow(self, kind: str) -> bool:
        """True if a line of ``kind`` may be logged now; else it is counted."""
        now = self._monotonic()
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = [now, 0, 0]
        elif now - window[0] >= self.interval:
            window[0], window[1] = now, 0
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        return False

    def summary(self) -> dict[str, int]:
        """Lines not logged since the last call, per kind (and forget them)."""
        suppressed = {}
        for kind, window in self._windows.items():
            if window[2]:
                suppressed[kind] = window[2]
                window[2] = 0
        return suppressed
