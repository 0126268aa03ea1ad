"""A worker whose standard output goes away stops, as a Unix tool does.

``flowkit worker app:main | head -3``: once ``head`` has its lines it closes the pipe, and
each later ``print`` in an agent would raise ``BrokenPipeError``. Left alone, every one of those
records would fail and go to the dead-letter topic while the worker ran on for nobody. Instead
the first write that finds the pipe closed points standard output at ``/dev/null`` (so no later
write, nor the interpreter's last flush, fails) and asks the worker to stop gracefully, as
Ctrl-C does: the records it has done are committed, and the summary goes to stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import structlog

log = structlog.get_logger("flowkit.cli")


class _GuardedStream:
    """``stream`` with ``write``/``flush`` that report a closed pipe instead of raising."""

    def __init__(self, stream: TextIO, on_closed: Callable[[], None]) -> None:
        self._stream = stream
        self._on_closed = on_closed

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._on_closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._on_closed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def stop_when_stdout_closes(stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, call ``stop`` (once) when a write to standard output finds the
    reader gone; ``sys.stdout`` is itself again afterwards."""
    stream = sys.stdout
    stopped = False

    def on_closed() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
        log.info("standard output closed; stopping gracefully")
        stop()

    sys.stdout = _GuardedStream(stream, on_closed)
    try:
        yield
    finally:
        sys.stdout = stream
