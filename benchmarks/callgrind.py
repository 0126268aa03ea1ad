"""Instruction counts under callgrind: the stable way to compare two loops on a busy machine.

A benchmark script runs itself three times under ``valgrind --tool=callgrind`` with
``--part setup|hand|flowkit`` (every part does the setup first); the differences between the
totals are each loop's own instructions.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

__all__ = ["compare", "count", "run"]


@contextlib.contextmanager
def run(
    module: str,
    part: str,
    size_flag: str,
    size: int,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, str]]:
    """Run ``python -m module --part part size_flag size`` under callgrind with
    ``options``; yields its stderr and the path of its output file (gone after the block)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/cg.out"
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                *options,
                f"--callgrind-out-file={path}",
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
            # A fixed hash seed: the same dict and set orders, so the same count every run.
            env={**os.environ, "PYTHONHASHSEED": "0", **(env or {})},
        )
        yield out.stderr, path


def count(module: str, part: str, size_flag: str, size: int) -> int:
    """Instructions of ``python -m module --part part size_flag size`` under callgrind."""
    with run(module, part, size_flag, size) as (stderr, _):
        match = re.search(r"Collected : (\d+)", stderr)
    if match is None:
        raise SystemExit(f"no instruction count from valgrind:\n{stderr[-2000:]}")
    return int(match.group(1))


def compare(
    module: str,
    size_flag: str,
    size: int,
    unit: str,
    others: Sequence[tuple[str, str]] = (),
) -> None:
    """Print instructions per ``unit`` for the hand-written loop and flowkit, and the ratios.

    flowkit also runs at a fifth of ``size``: the difference between the two runs is the
    cost of the extra records alone (the steady state), with the worker's start and stop,
    which a long run makes negligible, cancelled out. ``others``: more flowkit forms,
    (part, label) pairs, measured and printed the same way after ``--part flowkit``.
    """
    small = size // 5
    forms = [("flowkit", "flowkit"), *others]
    runs = [("setup", size), ("hand", size), ("setup", small)]
    runs += [(part, n) for part, _ in forms for n in (size, small)]
    # Two at a time: each run is one process, and the counts do not depend on the load.
    with ThreadPoolExecutor(2) as pool:
        jobs = {run: pool.submit(count, module, run[0], size_flag, run[1]) for run in runs}
        got = {run: job.result() for run, job in jobs.items()}
    setup, setup_small = got["setup", size], got["setup", small]
    hand = got["hand", size] - setup
    width = max(25, *(len(label) + 22 for _, label in forms))
    print(f"{size:,} {unit}s, instructions per {unit} (callgrind)")
    print(f"{'hand-written':<{width}}: {hand / size:>10,.0f}")
    for part, label in forms:
        flow = got[part, size] - setup
        per_extra = (flow - (got[part, small] - setup_small)) / (size - small)
        ratio = "ratio" if part == "flowkit" else f"{label}, ratio"
        print(
            f"{label + ', whole run':<{width}}: {flow / size:>10,.0f}"
            "   (worker start and stop included)"
        )
        print(
            f"{label + ', steady state':<{width}}: {per_extra:>10,.0f}"
            f"   (runs of {size:,} and {small:,})"
        )
        print(
            f"{ratio + ', whole run':<{width}}: {hand / flow:.2f}"
            "   (hand-written / flowkit instructions)"
        )
        print(f"{ratio + ', steady state':<{width}}: {hand / size / per_extra:.2f}")
