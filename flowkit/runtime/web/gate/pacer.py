"""How the gate paces what it sends: at most so many a second, after a burst, in arrival
order."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Pacer"]


class Pacer:
    """At most ``rate`` starts per second after a burst of ``burst``, in arrival order
    (the generic cell rate algorithm: one number, the theoretical arrival time).

    >>> now = [0.0]
    >>> pacer = Pacer(rate=10.0, burst=2, max_wait=0.15, clock=lambda: now[0])
    >>> [pacer.delay() for _ in range(4)]
    [0.0, 0.0, 0.1, None]
    """

    def __init__(
        self, rate: float, burst: int, max_wait: float, clock: Callable[[], float]
    ) -> None:
        self.interval = 1.0 / rate
        self.tolerance = (burst - 1) * self.interval
        self.max_wait = max_wait
        self.clock = clock
        self._tat = 0.0

    def delay(self) -> float | None:
        """Seconds the next start must wait (taking its place), or None: it would wait
        more than ``max_wait`` (and takes no place)."""
        now = self.clock()
        tat = max(self._tat, now)
        wait = max(0.0, tat - now - self.tolerance)
        if wait > self.max_wait:
            return None
        self._tat = tat + self.interval
        return round(wait, 9)
