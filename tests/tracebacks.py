"""Tracebacks in a worker's output that are not a failed record's.

The first time an agent fails at a place in the user's code, its ``record failed`` line
carries the traceback (rendered on the lines below it, or inside the JSON line). Any other
traceback is a crash, which the tests that check a worker's output rule out.
"""

from __future__ import annotations

__all__ = ["crashes"]

_START = "Traceback (most recent call last):"


def crashes(output: str | list[str]) -> list[str]:
    """The lines that start a traceback not belonging to a ``record failed`` line.

    >>> crashes("x [error] record failed agent=a\\nTraceback (most recent call last):\\n  ...")
    []
    >>> crashes("x [error] worker crashed\\nTraceback (most recent call last):\\n  ...")
    ['Traceback (most recent call last):']
    """
    lines = "".join(output).splitlines() if isinstance(output, list) else output.splitlines()
    found: list[str] = []
    owner = ""  # the last log line seen (a traceback's lines are not log lines)
    for line in lines:
        if _START in line and "record failed" not in line:
            if line.lstrip().startswith(_START) and "record failed" in owner:
                continue
            found.append(line)
        elif line and not line.startswith((" ", "\t")) and not _is_traceback_tail(line):
            owner = line
    return found


def _is_traceback_tail(line: str) -> bool:
    # The last line of a traceback ("ValueError: item 3 is bad") and the chained-exception
    # separators belong to the traceback above, not to a new log line.
    return ("Error" in line.split(":", 1)[0] or "Exception" in line.split(":", 1)[0]) or (
        line.startswith(("During handling", "The above exception"))
    )
