"""asyncio's and aiohttp's error reports, as flowkit's own log lines under a budget.

A web server that strangers can reach hears a lot of garbage: malformed requests,
connections reset half-way, an ``accept()`` that finds the process out of file
descriptors. aiohttp reports each through the standard library's ``logging`` with its
traceback, asyncio through the event loop's exception handler: many lines per event, in
plain text whatever the log format, and as many as an attacker cares to cause.
``ServerLogs`` takes both over while a server runs: each report becomes one structlog line
(``error=`` the exception in one line; its traceback only at the ``debug`` level, and
never when the endpoint has a token), at most ``burst``
of each kind per ``interval`` seconds (``LogBudget``), and once a kind went over, one line
saying how many were not written. Strings given as ``secrets`` are written ``***``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import structlog

from .logbudget import LogBudget

__all__ = ["ServerLogs"]

log = structlog.get_logger("flowkit.web")

# The standard-library loggers a server's reports come from.
LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal", "asyncio")
_LONGEST = 300  # characters of an error kept in a line


class ServerLogs(logging.Filter):
    """Installed on the running loop and the loggers by ``install``, until ``uninstall``."""

    def __init__(
        self, secrets: Iterable[str] = (), *, burst: int = 5, interval: float = 10.0
    ) -> None:
        super().__init__()
        self.budget = LogBudget(time.monotonic, burst=burst, interval=interval)
        self.secrets = [s for s in secrets if s]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed = False

    def install(self) -> None:
        """Take over the running loop's exception handler (unless the program set one of
        its own) and the server loggers' records."""
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() is None:
            loop.set_exception_handler(self._loop_error)
            self._loop = loop
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self)
        self._installed = True

    def uninstall(self) -> None:
        """Give both back; say what was not written. Idempotent."""
        if not self._installed:
            return
        self._installed = False
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self)
        loop, self._loop = self._loop, None
        if loop is not None and loop.get_exception_handler() == self._loop_error:
            loop.set_exception_handler(None)
        self._summary()

    # -- the two ways in ------------------------------------------------------------------

    def filter(self, record: logging.LogRecord) -> bool:
        """A standard-library record: written again as a structlog line, or counted;
        never written as it came (so: False)."""
        if record.levelno < logging.WARNING:
            return False  # aiohttp's debug chatter (a port scanner's bad methods, ...)
        kind = f"{record.name}:{record.msg}"
        if self.budget.allow(kind):
            self._summary()
            exc = record.exc_info[1] if record.exc_info else None
            self._write(record.levelno, record.getMessage(), record.name, exc)
        return False

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "error in the event loop")
        if self.budget.allow(f"asyncio:{message}"):
            self._summary()
            self._write(logging.ERROR, message, "asyncio", context.get("exception"))

    # -- writing --------------------------------------------------------------------------

    def _write(self, level: int, message: str, source: str, exc: object) -> None:
        fields: dict[str, Any] = {"source": source}
        if isinstance(exc, BaseException):
            fields["error"] = self._clean(repr(exc))
        log.log(level, self._clean(message), **fields)
        if isinstance(exc, BaseException) and not self.secrets:
            # With --log-level debug, the traceback too (its text could hold a token).
            log.debug("the traceback of the line above", source=source, exc_info=exc)

    def _clean(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        text = text.replace("\n", " ").replace("\r", " ")
        return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"

    def _summary(self) -> None:
        for kind, count in self.budget.summary().items():
            source, _, message = kind.partition(":")
            log.warning(
                "server log lines not written (over the budget)",
                source=source,
                like=self._clean(message),
                lines=count,
            )
