"""Test-session setup shared by tests/ and the doctests in flowkit/.

Logs go to stderr so doctest output (stdout) stays exact; the CLI configures its own.
"""

from __future__ import annotations

from flowkit.logs import configure_logging

configure_logging("warning", "console")
