"""Generated code: its source in tracebacks, one file name per function, unchanged bytecode."""

from __future__ import annotations

import dis
import gc
import linecache
import re
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from flowkit.routing import field, hash_field, pick, template
from flowkit.routing._codegen import DATA_ERRORS


def traceback_of(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception:
        return traceback.format_exc()
    pytest.fail("no exception")


def carets_under(text: str, line: str) -> str:
    """The part of ``line`` that the caret line after it in ``text`` marks."""
    lines = text.splitlines()
    shown = lines.index(f"    {line}")
    carets = lines[shown + 1]
    start = len(carets) - len(carets.lstrip())
    return f"    {line}"[start : len(carets)]


def test_a_traceback_through_a_generated_transform_shows_its_source_line() -> None:
    t = template("{n:03d}", to="key")
    text = traceback_of(lambda: t({"n": "seven"}))  # "d" is no format for a string
    line = "x = {**v, '@2': '@1'.format(v['@0'])}  # '@2': 'key', '@1': '{:03d}', '@0': 'n'"
    assert re.search(
        r'File "<flowkit transform \d+>", line 3, in generated\n    ' + re.escape(line), text
    )
    assert carets_under(text, line) == "'@1'.format(v['@0'])"
    assert text.endswith("ValueError: Unknown format code 'd' for object of type 'str'\n")


def test_a_traceback_through_a_generated_filter_shows_its_source_line() -> None:
    class Odd:
        def __gt__(self, other: object) -> bool:
            raise ValueError("no order")

    f = field("a.b") > 1
    text = traceback_of(lambda: f({"a": {"b": Odd()}}))
    line = "return True if (v['@0']['@1'] > '@2') else False  # '@0': 'a', '@1': 'b', '@2': 1"
    assert re.search(
        r'File "<flowkit filter \d+>", line 3, in generated\n    ' + re.escape(line), text
    )
    assert carets_under(text, line) == "v['@0']['@1'] > '@2'"


def test_a_missing_field_shows_the_generated_line_then_the_precise_error() -> None:
    t = pick("id", "user.email")
    text = traceback_of(lambda: t({"id": 1}))
    line = (
        "x = {'@3': v['@0'], '@4': {'@5': v['@1']['@2']}}"
        "  # '@3': 'id', '@0': 'id', '@4': 'user', '@5': 'email', '@1': 'user', '@2': 'email'"
    )
    assert line in text and "KeyError: 'user'" in text
    assert "During handling of the above exception" in text
    assert "    return fallback(v)\n" in text
    assert text.endswith("flowkit.errors.MissingFieldError: pick: field 'user.email' is missing\n")


def test_each_generated_function_has_its_own_source_and_a_hidden_salt() -> None:
    a, b = field("x") == "a", field("y") == "b"
    assert a.func.__code__.co_code == b.func.__code__.co_code  # one shape: the same bytecode
    files = {a.func.__code__.co_filename, b.func.__code__.co_filename}
    assert len(files) == 2 and all(re.fullmatch(r"<flowkit filter \d+>", name) for name in files)
    assert "# '@0': 'x', '@1': 'a'" in linecache.getline(a.func.__code__.co_filename, 3)
    assert "# '@0': 'y', '@1': 'b'" in linecache.getline(b.func.__code__.co_filename, 3)
    h = hash_field("email", salt=b"pepper")
    source = "".join(linecache.getlines(h.func.__code__.co_filename))
    assert "<hidden>" in source and "pepper" not in source


def test_the_source_goes_when_the_function_goes() -> None:
    f = field("x") == 1
    name = f.func.__code__.co_filename
    assert linecache.getlines(name)
    del f
    gc.collect()
    assert name not in linecache.cache


def fallback(v: Any) -> bool:
    return False


def hand_written(v: Any) -> bool:
    try:
        return True if ((v["a"]["b"] > 1) and (v["c"] == "x")) else False  # noqa: SIM210
    except DATA_ERRORS:
        return fallback(v)


def test_the_generated_code_is_what_one_would_write_by_hand() -> None:
    # Nothing added to the hot path: the same instructions, constants and names.
    f = (field("a.b") > 1) & (field("c") == "x")
    generated = [(i.opname, i.argval) for i in dis.get_instructions(f.func)]
    assert generated == [(i.opname, i.argval) for i in dis.get_instructions(hand_written)]
