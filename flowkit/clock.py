"""Time, injectable: the worker asks a ``Clock`` rather than the time module.

``SystemClock`` is the real one. ``flowkit.testing.FakeClock`` moves only when told,
so tests of timers and commit intervals are exact and fast.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Wall-clock time in seconds, a monotonic time, and a sleep on the same clock."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and ``asyncio.sleep``."""

    # The time module's functions themselves, not methods that call them: a burst of bad
    # records reads both once per record (a dead letter's time of failure, the log budget).
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
