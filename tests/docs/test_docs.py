"""The docs run: their shell sessions are executed and compared, their Python is executed.

What each kind of block gets is described in ``blocks.py`` (the marker convention) and
``console.py`` (how a shell session is compared).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import Block, pages, read_blocks
from tests.docs.console import REPO, matches, normalise, parse_console, run_command

_MARKERS = ("fragment", "signature", "kafka", "needs ", "run with ", "skip", "refused ")
_KAFKA_URL = re.compile(r"kafka://[\w.-]+:\d+(,[\w.-]+:\d+)*")


def _whole(name: str, files: dict[str, str]) -> str:
    """The text a fragment is part of: a titled block of the page, or a file of the repository."""
    if name in files:
        return files[name]
    path = REPO / name
    assert path.is_file(), f"{name} is neither a titled block of the page nor a file of the repo"
    return path.read_text()


def _unindented(text: str) -> str:
    """``text`` without the indentation of its lines: a fragment may be shown dedented."""
    return "\n".join(line.strip() for line in text.splitlines())


def _copy_files(names: list[str], workdir: Path) -> None:
    """Write ``page:file`` titled blocks of other pages into ``workdir``."""
    for name in names:
        page, _, title = name.partition(":")
        found = [b for b in read_blocks(page) if b.title == title]
        assert found, f"docs/{page} has no block titled {title}"
        (workdir / title).write_text(found[0].body)


def _markers(block: Block) -> list[str]:
    return [m.strip() for m in (block.marker or "").split(";") if m.strip()]


def _has_output(block: Block) -> bool:
    return any(cmd.expected for cmd in parse_console(block.body))


def _run_python(block: Block, namespace: dict[str, Any]) -> None:
    if ">>>" in block.body:
        test = doctest.DocTestParser().get_doctest(
            block.body, namespace, block.where, block.where, 0
        )
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        output: list[str] = []
        runner.run(test, out=output.append, clear_globs=False)
        namespace.update(test.globs)  # a DocTest runs on a copy of the names it is given
        assert runner.failures == 0, "".join(output)
        return
    exec(compile(block.body, block.where, "exec"), namespace)


def _import_file(block: Block, workdir: Path, refused: str | None = None) -> None:
    """Import the page's file ``block``; with ``refused``, the import must raise that
    flowkit error (a page showing a mistake flowkit refuses)."""
    assert block.title is not None
    name = block.title.removesuffix(".py")
    sys.modules.pop(name, None)
    try:
        importlib.import_module(name)
    except Exception as exc:
        if refused is not None and type(exc).__name__ == refused:
            return
        raise AssertionError(f"{block.where}: importing {block.title} failed: {exc!r}") from exc
    finally:
        sys.modules.pop(name, None)
    assert refused is None, f"{block.where}: importing {block.title} raised no {refused}"


def _run_console(block: Block, workdir: Path, kafka: str | None, extra: str) -> None:
    for command in parse_console(block.body):
        if not command.expected:
            continue
        line = _KAFKA_URL.sub(f"kafka://{kafka}", command.line) if kafka else None
        if extra:
            line = f"{line or command.line} {extra}"
        actual = run_command(command, workdir, line)
        if not matches(command.expected, actual, workdir):
            shown = "\n".join(command.expected)
            raise AssertionError(
                f"{block.where}: $ {command.line}\n--- the page shows:\n{shown}\n"
                f"--- the command printed:\n{actual}\n--- normalised:\n"
                f"{normalise(actual, workdir)}"
            )


@pytest.mark.parametrize("page", pages())
def test_page(
    page: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = read_blocks(page)
    monkeypatch.chdir(tmp_path)  # relative paths of a page (a data directory) land there
    # A fragment may carry the title of the file it is a piece of: it is not that file.
    files = {
        b.title: b.body
        for b in blocks
        if b.title and not any(m.startswith("fragment") for m in _markers(b))
    }
    # A real module, so that type hints of records declared on the page resolve.
    module = types.ModuleType("__docs__")
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    sys.path.insert(0, str(tmp_path))
    try:
        for block in blocks:
            markers = _markers(block)
            for marker in markers:
                assert marker.startswith(_MARKERS), f"{block.where}: unknown marker {marker!r}"
                assert marker != "skip", f"{block.where}: say why it is skipped: 'skip: REASON'"
            for marker in markers:
                if marker.startswith("needs "):
                    _copy_files(marker.removeprefix("needs ").split(), tmp_path)
            fragment = next((m for m in markers if m.startswith("fragment")), None)
            if any(m.startswith("skip") for m in markers):
                continue
            if block.title and fragment is None:
                (tmp_path / block.title).write_text(block.body)
            if block.lang == "python":
                if "signature" in markers:
                    continue  # a call signature, shown as Python: neither valid nor runnable
                if fragment is not None:
                    ast.parse(block.body)
                    whole = fragment.removeprefix("fragment").strip().removeprefix("of").strip()
                    if whole:
                        assert _unindented(block.body) in _unindented(_whole(whole, files)), (
                            f"{block.where}: not a part of {whole}"
                        )
                elif block.title:
                    if not block.title.startswith("test_"):
                        refused = next(
                            (
                                m.removeprefix("refused ")
                                for m in markers
                                if m.startswith("refused ")
                            ),
                            None,
                        )
                        _import_file(block, tmp_path, refused)
                else:
                    _run_python(block, namespace)
            elif block.lang == "console" and _has_output(block):
                kafka = None
                if "kafka" in markers:
                    kafka = request.getfixturevalue("kafka_bootstrap")
                extra = " ".join(
                    m.removeprefix("run with ") for m in markers if m.startswith("run with ")
                )
                _run_console(block, tmp_path, kafka, extra)
    finally:
        sys.path.remove(str(tmp_path))
        del sys.modules[module.__name__]


def _code_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("page", pages())
def test_step_by_step_pieces_assemble_into_the_file_the_page_shows(page: str) -> None:
    """A reader who builds a page's file from its pieces, in order, gets the whole file.

    Applies to fragments of a file titled on the same page (a tutorial's steps); each piece
    also being *a part* of the whole is checked by ``test_page``.
    """
    blocks = read_blocks(page)
    wholes = {
        b.title: b.body
        for b in blocks
        if b.title and not any(m.startswith("fragment") for m in _markers(b))
    }
    pieces: dict[str, list[str]] = {}
    for block in blocks:
        for marker in _markers(block):
            name = marker.removeprefix("fragment of").strip()
            if marker.startswith("fragment of") and name in wholes:
                pieces.setdefault(name, []).extend(_code_lines(block.body))
    for name, lines in pieces.items():
        assert lines == _code_lines(wholes[name]), (
            f"docs/{page}: the pieces of {name}, put together in order, are not the whole file"
        )
