"""The Faust examples ported in docs/porting-from-faust.md run and print exactly this."""

from __future__ import annotations

import importlib
import re

import pytest

import flowkit

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")  # the worker's own log lines

EXPECTED = {
    "examples.page_views": """\
/home: 1 now, 0 in the window before
/home: 2 now, 0 in the window before
/docs: 1 now, 0 in the window before
/home: 3 now, 0 in the window before
/home: 1 now, 3 in the window before
/docs: 1 now, 1 in the window before
/home by window: [3, 1]
""",
    "examples.word_count": """\
word count starting
the: 3 fox: 2
tally: brown=1, dog=1, fox=2, lazy=1, quick=1, the=3
""",
    "examples.withdrawals": """\
this hour: {'user_0': 48900.0, 'user_1': 171700.0, 'user_2': 38900.0, \
'user_3': 77900.0, 'user_4': 55300.0}
country_0 [+0s, +10s): 119100.0
country_0 [+10s, +20s): 83200.0
country_2 [+10s, +20s): 36800.0
country_0 [+20s, +30s): 144400.0
country_1 [+20s, +30s): 9200.0
""",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_a_ported_example_prints_exactly_its_output(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.reload(importlib.import_module(name))  # fresh module-level state
    assert isinstance(module.app, flowkit.App)
    assert module.app.graph().check() == []
    await module.main()
    out = capsys.readouterr().out
    assert (
        "".join(line for line in out.splitlines(True) if not LOG_LINE.match(line))
        == (EXPECTED[name])
    )


def test_the_porting_guide_shows_the_examples_as_they_are() -> None:
    """Each flowkit block of the guide is a piece of the example file it names."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    guide = (root / "docs" / "porting-from-faust.md").read_text()
    blocks = re.findall(r'```python title="(examples/\w+\.py)"\n(.*?)```', guide, re.S)
    assert sorted(name for name, _ in blocks) == [
        "examples/page_views.py",
        "examples/withdrawals.py",
        "examples/word_count.py",
    ]
    for name, code in blocks:
        assert code in (root / name).read_text(), name
