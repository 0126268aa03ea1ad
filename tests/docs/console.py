"""Run the commands of a docs ``console`` block and compare what they print with the page.

The page shows a terminal: ``$ command`` lines, each followed by what it prints (stdout and
stderr together). Before comparing, both sides are normalised for what changes from run to
run: timestamps, durations and rates, record counts in summaries, ports and the working
directory. A line ``...`` stands for any number of lines, and ``...`` inside a line for any
text on that line (as in doctest). A line ``^C`` means the command runs
until the lines above it have appeared, then gets SIGINT, as a reader's Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Command", "normalise", "parse_console", "run_command"]

REPO = Path(__file__).resolve().parents[2]
_INTERRUPT_DEADLINE = 20.0
_EXIT_DEADLINE = 30.0

_NORMALISERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "<TIME>"),
    (re.compile(r"\b(in|after) \d+(\.\d+)? (s|ms)\b"), r"\1 <N> \3"),
    (re.compile(r"\([\d,]+ records?/s\)"), "(<N> records/s)"),
    (re.compile(r"\bprocessed [\d,]+ records?\b"), "processed <N> records"),
    (re.compile(r"\brecords=\d+"), "records=<N>"),
    (re.compile(r"flowkit-dev-broker-\w+"), "flowkit-dev-broker-<ID>"),
    (re.compile(r"\b(127\.0\.0\.1|localhost):\d+"), r"\1:<PORT>"),
    (re.compile(r"\b(\d+ (passed|failed|skipped))( in [\d.]+s)?"), r"\1"),
    (re.compile(r"[ \t]+$", re.MULTILINE), ""),
]


@dataclass
class Command:
    """One ``$ command`` of a console block and the output the page shows for it."""

    line: str
    expected: list[str]

    @property
    def interrupted(self) -> bool:
        return "^C" in self.expected


def parse_console(body: str) -> list[Command]:
    """The commands of a console block (a ``\\`` at a line's end continues the command)."""
    commands: list[Command] = []
    lines = body.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            commands.append(Command(text, []))
        elif commands:
            commands[-1].expected.append(line)
        i += 1
    return commands


def normalise(text: str, workdir: Path) -> str:
    """``text`` with what changes from run to run replaced by placeholders."""
    text = text.replace(str(workdir), "<DIR>").replace(str(REPO), "<REPO>")
    for pattern, replacement in _NORMALISERS:
        text = pattern.sub(replacement, text)
    return text


def _pattern(lines: list[str], workdir: Path) -> str:
    parts = []
    for line in lines:
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            shown = normalise(line, workdir).split("...")
            parts.append(r"[^\n]*".join(re.escape(part) for part in shown) + r"\n")
    return "".join(parts)


def matches(expected: list[str], actual: str, workdir: Path) -> bool:
    """Whether ``actual`` (raw output) is what the page shows (``...`` and ``^C`` understood)."""
    shown = [line for line in expected if line != "^C"]
    return re.fullmatch(_pattern(shown, workdir), normalise(actual, workdir)) is not None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        COLUMNS="80",
        TERM="dumb",
        NO_COLOR="1",
    )
    env.pop("FORCE_COLOR", None)
    return env


def run_command(command: Command, workdir: Path, line: str | None = None) -> str:
    """Run ``command`` (or ``line`` in its place) in ``workdir``; its output, stderr included."""
    proc = subprocess.Popen(
        ["bash", "-c", line or command.line],
        cwd=workdir,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    if not command.interrupted:
        try:
            out, _ = proc.communicate(timeout=_EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"{command.line!r} did not finish in {_EXIT_DEADLINE} s") from None
        return out.decode()
    before = command.expected[: command.expected.index("^C")]
    prefix = re.compile(_pattern(before, workdir))
    os.set_blocking(proc.stdout.fileno(), False)
    seen = b""
    deadline = time.monotonic() + _INTERRUPT_DEADLINE
    while time.monotonic() < deadline and proc.poll() is None:
        chunk = proc.stdout.read() or b""
        seen += chunk
        if prefix.match(normalise(seen.decode(errors="replace"), workdir)):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    os.set_blocking(proc.stdout.fileno(), True)
    try:
        rest, _ = proc.communicate(timeout=_EXIT_DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    return (seen + rest).decode(errors="replace")
