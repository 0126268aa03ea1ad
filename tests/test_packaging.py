"""The installed distribution exposes the ``flowkit`` package and nothing else of the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PROBE = """
import importlib.util
import flowkit
print(flowkit.__name__, *(importlib.util.find_spec(n) is not None
      for n in ("examples", "tests", "benchmarks", "conftest")))
"""


def test_only_flowkit_is_importable_from_elsewhere(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["flowkit", "False", "False", "False", "False"]
