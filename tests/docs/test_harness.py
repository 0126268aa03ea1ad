"""The docs tests' own parts: a wrong page must fail them."""

from __future__ import annotations

from pathlib import Path

from tests.docs.blocks import pages, read_blocks
from tests.docs.console import matches, parse_console

WORKDIR = Path("/nonexistent")


def test_sessions_are_split_into_commands_and_their_output() -> None:
    commands = parse_console("$ a \\\n  --b\nout 1\nout 2\n$ c\n")
    assert [(c.line, c.expected) for c in commands] == [("a  --b", ["out 1", "out 2"]), ("c", [])]


def test_output_is_compared_after_normalising_what_changes_between_runs() -> None:
    shown = ["2026-01-01T00:00:00.1Z [info] at 127.0.0.1:9100", "processed 5 records in 2.6 s"]
    actual = "2026-11-30T11:00:00.999Z [info] at 127.0.0.1:41234\nprocessed 812 records in 9.1 s\n"
    assert matches(shown, actual, WORKDIR)
    assert not matches(shown, actual.replace("info", "warning"), WORKDIR)
    assert not matches(["processed 5 records"], "processed 5 records\nextra line\n", WORKDIR)


def test_ellipses_stand_for_lines_and_for_text_in_a_line() -> None:
    shown = ["first", "...", "x ... z", "^C", "last"]
    assert matches(shown, "first\nany\nlines\nx y z\nlast\n", WORKDIR)
    assert matches(shown, "first\nx  z\nlast\n", WORKDIR)
    assert not matches(shown, "first\nx y\nlast\n", WORKDIR)


def test_every_page_is_found_with_its_blocks() -> None:
    found = pages()
    assert "getting-started.md" in found and "concepts/windows.md" in found
    blocks = read_blocks("getting-started.md")
    titled = {b.title for b in blocks if b.title}
    assert {"orders.py", "test_orders.py", "pytest.ini"} <= titled
    assert any(b.marker == "fragment of orders.py" for b in blocks)
