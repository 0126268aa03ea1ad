"""``python -m benchmarks``: the comparisons, one a line, then the probes.

Each line is the command and the first line of the module's docstring, read from its source
(nothing is imported, so the list shows even where a client library is missing).
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from pathlib import Path

from benchmarks import COMPARISONS

PROBES = Path(__file__).resolve().parent / "probes"


def summary(module: str) -> str:
    """The first line of ``module``'s docstring, without reST's double backquotes."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"benchmarks: no module {module}")
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return doc.split("\n", 1)[0].replace("``", "")


def probes() -> list[str]:
    """The probes' module names, sorted."""
    return sorted(f"benchmarks.probes.{m.name}" for m in pkgutil.iter_modules([str(PROBES)]))


def listing() -> str:
    comparisons = [f"benchmarks.{name}" for name in COMPARISONS]
    width = max(len(f"python -m {m}") for m in [*comparisons, *probes()])
    lines = [
        "Comparisons: flowkit against a baseline, same data, same run (docs/benchmarks.md).",
        "Options: add --help to a command.",
        "",
    ]
    lines += [f"  {'python -m ' + m:<{width}}  {summary(m)}" for m in comparisons]
    lines += ["", "Probes: one mechanism each, to find where a comparison's time goes.", ""]
    lines += [f"  {'python -m ' + m:<{width}}  {summary(m)}" for m in probes()]
    return "\n".join(lines)


def main() -> None:
    print(listing())


if __name__ == "__main__":
    main()
