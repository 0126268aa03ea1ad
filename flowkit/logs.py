"""Logging setup for the command line. Library modules only call ``structlog.get_logger``.

A log line that cannot be written is dropped, never raised: stderr may be closed
(``2>&-``), or a pipe whose reader is gone (``2>&1 | head -4``, a log shipper that died),
and a failing write inside a signal handler or a shutdown would otherwise stop the stop.
``GuardedStream`` is that rule for any text stream (the command line puts its standard
streams behind one).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, Literal, TextIO, cast

import structlog

__all__ = ["LEVELS", "GuardedStream", "configure_logging"]

LEVELS = ("debug", "info", "warning", "error")


class GuardedStream:
    """``stream`` whose ``write`` and ``flush`` do not raise.

    When a write finds the stream gone for good (``BrokenPipeError``, a closed
    descriptor), its descriptor is pointed at ``/dev/null``, so that no later write fails
    either (nor the interpreter's last flush, nor a library writing to the descriptor
    itself), and ``on_gone`` is called, once. Any other failed write (a full disk) is
    dropped, or raised with ``drop_others=False``: the stream is still there, so what
    was written to it may matter (an app's output, unlike a log line).

    >>> import io
    >>> class Gone(io.StringIO):
    ...     def write(self, text):
    ...         raise BrokenPipeError
    >>> calls = []
    >>> out = GuardedStream(Gone(), on_gone=lambda: calls.append("gone"))
    >>> out.write("a line\\n"), out.write("another\\n"), out.gone, calls
    (7, 8, True, ['gone'])
    """

    def __init__(
        self,
        stream: TextIO | None,
        on_gone: Callable[[], None] | None = None,
        *,
        drop_others: bool = True,
    ) -> None:
        self.stream = stream  # None: the interpreter started without it (fd closed)
        self.on_gone = on_gone
        self.drop_others = drop_others
        self.gone = stream is None

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                return self.stream.write(text)
            except (OSError, ValueError) as exc:  # ValueError: the file object was closed
                if not self._absorbed(exc):
                    raise
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as exc:
                if not self._absorbed(exc):
                    raise

    def isatty(self) -> bool:
        try:
            return self.stream is not None and not self.gone and self.stream.isatty()
        except (OSError, ValueError):
            return False

    def _absorbed(self, exc: Exception) -> bool:
        if not _gone_for_good(exc):
            return self.drop_others  # this line is lost; the next may pass
        first = not self.gone
        self.gone = True
        if isinstance(exc, OSError):
            _to_devnull(self.stream)
        if first and self.on_gone is not None:
            self.on_gone()
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _gone_for_good(exc: Exception) -> bool:
    """After these a stream never takes a write again: its reader is gone, or it is not
    open (a ``ValueError``: the file object was closed)."""
    if isinstance(exc, BrokenPipeError | ConnectionResetError | ValueError):
        return True
    return isinstance(exc, OSError) and exc.errno == errno.EBADF


def _to_devnull(stream: TextIO | None) -> None:
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError):
        return
    if fd < 0:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def configure_logging(level: str = "info", fmt: Literal["console", "json"] = "console") -> None:
    """Send structlog and stdlib logs to stderr, as readable lines or JSON; a line that
    cannot be written is dropped (``GuardedStream``)."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    stderr = sys.stderr
    stream = stderr if isinstance(stderr, GuardedStream) else GuardedStream(stderr)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    # The list that loggers cached earlier hold, changed in place rather than replaced:
    # a second configuration (the command line's, run in a process that logged already)
    # reaches them too, instead of leaving them with the first one's processors.
    processors: list[structlog.types.Processor] = structlog.get_config()["processors"]
    processors[:] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, stream)),
        cache_logger_on_first_use=True,
    )
    # aiokafka and friends log through the standard library.
    logging.basicConfig(
        level=max(numeric, logging.WARNING),
        stream=cast(TextIO, stream),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
