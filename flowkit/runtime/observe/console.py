"""What a worker says on its console: table recovery progress and a periodic status line.

While tables recover, a progress bar (records done / total, rate) is drawn on stderr when
stderr is a terminal, and a ``recovering tables`` log line is written every few seconds
otherwise (a file or a log collector has no use for a bar). While the worker runs, a
``status`` line at info level every ``status_interval`` seconds gives records/s since the
last line, the lag in records and the partitions held. On the embedded broker, where only
the worker's own process can write, a worker that has received nothing after a few seconds
says so once, and how to feed it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, TextIO

import structlog

from ..tables.recovery import RecoveryProgress
from .collector import partition_lag

if TYPE_CHECKING:
    from ..worker import Worker

__all__ = ["Console"]

log = structlog.get_logger(__name__)

_BAR_EVERY = 0.1  # seconds between redraws of the bar
_LOG_EVERY = 2.0  # seconds between progress log lines when not on a terminal
_WIDTH = 30


class Console:
    """Recovery progress and status lines for one worker."""

    def __init__(self, worker: Worker, stream: TextIO | None = None) -> None:
        self.worker = worker
        self.stream = stream or sys.stderr
        self.log = log  # where the lines go (a test can hand its own)
        self._last_draw = 0.0
        self._drawn = False
        self._lost = False  # a write to the terminal failed: log lines from then on
        self._last_records = 0
        self._last_time = time.monotonic()
        worker.state.recovery.listeners.append(self.progress)

    @property
    def terminal(self) -> bool:
        """True when the stream is a terminal: a bar, not log lines."""
        if self._lost:
            return False
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def progress(self, recovery: RecoveryProgress) -> None:
        """Called once per changelog batch read, and when the recovery ends."""
        now = time.monotonic()
        if recovery.active and now - self._last_draw < (
            _BAR_EVERY if self.terminal else _LOG_EVERY
        ):
            return
        self._last_draw = now
        total = recovery.read + recovery.left
        if self.terminal:
            self._bar(recovery, total)
        elif recovery.active:
            self.log.info(
                "recovering tables",
                records=recovery.read,
                total=total,
                rate=round(recovery.rate()),
            )

    def _bar(self, recovery: RecoveryProgress, total: int) -> None:
        if not recovery.active:
            if self._drawn:
                self._draw("\r" + " " * (_WIDTH + 60) + "\r")
                self._drawn = False
            return
        done = recovery.read
        filled = _WIDTH if total == 0 else int(_WIDTH * done / total)
        bar = "#" * filled + "." * (_WIDTH - filled)
        self._draw(
            f"\rrecovering tables [{bar}] {done:,}/{total:,} records {recovery.rate():,.0f}/s"
        )
        self._drawn = True

    def _draw(self, text: str) -> None:
        # A terminal that went away (a closed window, a dead ssh session) fails the
        # write: the recovery goes on, its progress no longer drawn.
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._lost = True

    def status_line(self) -> dict[str, object]:
        """The figures of one status line (and reset the rate's start)."""
        worker = self.worker
        now = time.monotonic()
        records = worker.records_in
        seconds = now - self._last_time
        rate = (records - self._last_records) / seconds if seconds > 0 else 0.0
        self._last_records, self._last_time = records, now
        lag = partition_lag(worker)
        return {
            "records_per_s": round(rate, 1),
            "lag": sum(records for _, _, records, _ in lag),
            "lag_seconds": round(max((s for *_, s in lag), default=0.0), 1),
            "partitions": len(lag),
        }

    async def run_status(self, interval: float) -> None:
        """Log a ``status`` line every ``interval`` seconds (real time)."""
        while True:
            await asyncio.sleep(interval)
            self.log.info("status", **self.status_line())

    async def hint_if_idle(self, after: float) -> None:
        """Say once, after ``after`` seconds without a record, why none may ever come.

        On the embedded broker (``memory://``) nothing outside this process can write to
        the app's topics: an app without a timer or task that sends waits for ever.
        """
        await asyncio.sleep(after)
        if self.worker.records_in == 0:
            self.log.warning(
                f"no record in {after:g} s: on the embedded broker (memory://) only this "
                "process writes to the app's topics; add a timer or task that sends records, "
                "or run on Kafka (--broker kafka://HOST:PORT) and write them with "
                "`flowkit send`"
            )
