"""The command's standard streams: one that cannot be written never stops a command.

``guard_standard_streams()``, first thing in every ``flowkit`` process: a descriptor 0, 1 or
2 that the command was started without (``2>&-``, ``>&-``) is opened on ``/dev/null`` (or the
first socket the worker opens would take its number, and receive whatever a library writes
to "stderr"), and ``sys.stdout`` and ``sys.stderr`` become ``GuardedStream``s: a write that
finds the stream gone (a closed pipe or descriptor) is dropped instead of raised; on stderr,
so is one that fails otherwise (a full disk). A log line, the summary, an error line or a printed
result that cannot be written is lost; the command, or the worker's stop, goes on.

``stop_when_stdout_closes(stop)``: a worker whose standard output goes away stops, as a Unix
tool does. ``flowkit worker app:main | head -3``: once ``head`` has its lines it closes the
pipe, and each later ``print`` in an agent would raise ``BrokenPipeError``. Left alone,
every one of those records would fail and go to the dead-letter topic while the worker ran
on for nobody. Instead the first write that finds the pipe closed points standard output at
``/dev/null`` (so no later write, nor the interpreter's last flush, fails) and asks the
worker to stop gracefully, as Ctrl-C does: the records it has done are committed, and the
summary goes to stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TextIO, cast

import structlog

from ..logs import GuardedStream

__all__ = ["guard_standard_streams", "stop_when_stdout_closes"]

log = structlog.get_logger("flowkit.cli")


def guard_standard_streams() -> None:
    """Open missing standard descriptors on ``/dev/null``; guard stdout and stderr."""
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:  # not open: the lowest free number is this one (0, 1, 2 in order)
            opened = os.open(os.devnull, flags)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
    # The interpreter leaves a stream None when its descriptor was missing at start.
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (lives as long as the process)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115
    if not isinstance(sys.stdout, GuardedStream):  # results: a full disk is still an error
        sys.stdout = cast(TextIO, GuardedStream(sys.stdout, drop_others=False))
    if not isinstance(sys.stderr, GuardedStream):  # log lines: dropped, whatever the failure
        sys.stderr = cast(TextIO, GuardedStream(sys.stderr))


@contextlib.contextmanager
def stop_when_stdout_closes(stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, call ``stop`` (once) when a write to standard output finds the
    reader gone; ``sys.stdout`` is itself again afterwards."""
    original = sys.stdout
    stream = (
        original
        if isinstance(original, GuardedStream)
        else GuardedStream(original, drop_others=False)
    )

    def on_gone() -> None:
        stop()  # first: a log line that cannot be written must not keep the worker going
        log.info("standard output closed; stopping gracefully")

    previous, stream.on_gone = stream.on_gone, on_gone
    sys.stdout = cast(TextIO, stream)
    try:
        yield
    finally:
        stream.on_gone = previous
        sys.stdout = original
