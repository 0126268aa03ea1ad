"""Logging setup for the command line. Library modules only call ``structlog.get_logger``."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ["LEVELS", "configure_logging"]

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", fmt: Literal["console", "json"] = "console") -> None:
    """Send structlog and stdlib logs to stderr, as readable lines or JSON."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # aiokafka and friends log through the standard library.
    logging.basicConfig(
        level=max(numeric, logging.WARNING),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
