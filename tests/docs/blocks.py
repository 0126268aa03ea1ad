"""The code blocks of the docs, as the docs tests see them.

A fenced block is checked according to its language, its title and an optional marker: an
HTML comment on the line just above the fence (MkDocs passes it through; readers never see it).

- ``python title="shop.py"``: written as ``shop.py`` into the page's working directory, then
  imported there (so it must run), before any later block of the page runs.
- ``python``: executed in the page's namespace, in order (``>>>`` blocks are doctests).
- ``console``: every ``$ command`` runs in the page's working directory and the output below
  it is compared (see ``console.py``). Blocks that show no output are not run.
- ``<!-- docs-test: fragment -->`` on a Python block: a piece shown out of context on purpose;
  it is only parsed. ``<!-- docs-test: fragment of shop.py -->``: also checked to be a verbatim
  part of the page's ``shop.py`` block (or of a file of the repository, such as
  ``examples/ysb.py``), so the pieces cannot drift from the whole. A fragment may carry the
  title of the file it is a piece of (``python title="examples/ysb.py"``): it is neither
  written into the working directory nor taken for that file.
- ``<!-- docs-test: signature -->``: a call signature shown as Python; not parsed.
- ``<!-- docs-test: kafka -->`` on a console block: it runs against the test session's Kafka
  broker, which replaces the ``kafka://HOST:PORT`` shown.
- ``<!-- docs-test: needs index.md:clicks.py -->``: the block uses a file another page shows;
  it is written into this page's working directory first.
- ``<!-- docs-test: run with --port 0 -->``: the commands run with these arguments added (a
  fixed port could be taken on the machine that runs the tests).
- ``<!-- docs-test: refused DefinitionError -->`` on a titled Python block: a file showing a
  mistake; importing it must raise that flowkit error (a console block then shows it).
- ``<!-- docs-test: skip REASON -->``: not run, for a reason the comment states.

Several markers go in one comment, separated by ``;``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DOCS", "Block", "pages", "read_blocks"]

DOCS = Path(__file__).resolve().parents[2] / "docs"

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<attrs>.*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<marker>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a docs page."""

    page: str
    line: int
    lang: str
    title: str | None
    marker: str | None
    body: str

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def pages() -> list[str]:
    """Every page of the docs, relative to docs/."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def read_blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page``, in order (fences indented under a list item included)."""
    lines = (DOCS / page).read_text().split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent = len(match["indent"])
        end = i + 1
        while not lines[end].startswith(" " * indent + "```"):
            end += 1
        title = _TITLE.search(match["attrs"])
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        body = "\n".join(line[indent:] for line in lines[i + 1 : end])
        blocks.append(
            Block(
                page=page,
                line=i + 1,
                lang=match["lang"],
                title=title["title"] if title else None,
                marker=marker["marker"] if marker else None,
                body=body + "\n",
            )
        )
        i = end + 1
    return blocks
