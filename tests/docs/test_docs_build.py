"""The docs build that ``scripts/check`` runs fails on a broken link, anchor or nav entry.

Each case builds a two-page site that inherits the project's mkdocs.yml (theme, markdown
extensions, validation rules) through ``scripts/docs-build``, the command the check runs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OTHER = "# Other\n\n## A heading\n\nText.\n"


def build(tmp_path: Path, index: str, nav: str = "[index.md, other.md]") -> tuple[int, str]:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(index)
    (docs / "other.md").write_text(OTHER)
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\nnav: {nav}\n")
    done = subprocess.run(
        [ROOT / "scripts" / "docs-build", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def test_a_site_whose_links_resolve_builds(tmp_path: Path) -> None:
    code, output = build(tmp_path, "# Home\n\nSee [there](other.md#a-heading).\n")
    assert code == 0, output
    assert "INFO" not in output  # only what needs reading is shown


def test_each_broken_reference_fails_the_build_and_is_named(tmp_path: Path) -> None:
    index = "# Home\n\nSee [a](missing.md) and [b](other.md#no-such-heading).\n"
    code, output = build(tmp_path, index, nav="[index.md, other.md, gone.md]")
    assert code != 0
    assert "missing.md" in output  # a link to no page
    assert "#no-such-heading" in output  # an anchor on no heading
    assert "gone.md" in output  # a nav entry for no page
