"""The ``flowkit`` command line (``flowkit worker APP``, ``flowkit graph APP``)."""

from __future__ import annotations

from .main import cli
from .stdio import guard_standard_streams

__all__ = ["cli", "main"]


def main() -> None:
    """Run the ``flowkit`` command (the console script's entry point)."""
    guard_standard_streams()  # a closed stdout or stderr stops no command, nor a stop
    cli(prog_name="flowkit")
