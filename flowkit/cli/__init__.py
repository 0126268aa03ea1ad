"""The ``flowkit`` command line (``flowkit worker APP``, ``flowkit graph APP``)."""

from __future__ import annotations

from .main import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Run the ``flowkit`` command (the console script's entry point)."""
    cli(prog_name="flowkit")
