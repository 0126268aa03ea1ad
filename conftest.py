"""Test-session setup shared by tests/ and the doctests in flowkit/.

Logs go to stderr so doctest output (stdout) stays exact; the CLI configures its own.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

from flowkit.logs import configure_logging

configure_logging("warning", "console")

ROOT = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Compile flowkit's sources (and the test apps) to bytecode once, before any test.

    Tests start a few hundred Python processes (``flowkit`` commands, workers, process
    groups), and each imports flowkit: without cached bytecode, as under
    ``PYTHONDONTWRITEBYTECODE``, each one compiles every module again, a good part of its
    start. Files already compiled are left as they are; a tree that cannot be written to
    is only slower.
    """
    for package in ("flowkit", "tests", "examples"):
        compileall.compile_dir(ROOT / package, quiet=2)
