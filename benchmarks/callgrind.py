"""Instruction counts under callgrind: the stable way to compare two loops on a busy machine.

A benchmark script runs itself three times under ``valgrind --tool=callgrind`` with
``--part setup|hand|flowkit`` (every part does the setup first); the differences between the
totals are each loop's own instructions.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

__all__ = ["compare"]


def _count(module: str, part: str, size_flag: str, size: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                "-m",
                module,
                "--part",
                part,
                size_flag,
                str(size),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(match.group(1))


def compare(module: str, size_flag: str, size: int, unit: str) -> None:
    """Print instructions per ``unit`` for the hand-written loop and flowkit, and the ratio."""
    setup = _count(module, "setup", size_flag, size)
    hand = _count(module, "hand", size_flag, size) - setup
    flow = _count(module, "flowkit", size_flag, size) - setup
    print(f"{size:,} {unit}s, instructions per {unit} (callgrind)")
    print(f"hand-written : {hand / size:>10,.0f}")
    print(f"flowkit      : {flow / size:>10,.0f}   (includes worker start and stop)")
    print(f"ratio        : {hand / flow:.2f}   (hand-written / flowkit instructions)")
