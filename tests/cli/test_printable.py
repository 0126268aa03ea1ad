"""What ``flowkit dlq show`` and ``flowkit tables show`` print of a record: any bytes in
its key, value and header names and values, and never a character that is not printable
(no C0 or C1 control, ESC, DEL, bidi override, line separator) on the terminal."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from flowkit._printable import printable, printable_json
from flowkit.cli.tables import as_json_text, text_lines
from flowkit.deadletter import FAILURE_HEADERS, DeadLetter, dead_letter_headers, fit_dead_letter
from flowkit.records import Message

HOSTILE = "\x1b]0;owned\x07\x1b[2J\n\r\x00\x7f\x85\x9b\u202e\u2066\u2028\ufeff\U000e0001"
# Text with the characters a terminal acts on more often than plain st.text() draws them.
texts = st.one_of(
    st.text(),
    st.lists(st.sampled_from(HOSTILE + "ab é"), max_size=30).map("".join),
)
raw = st.one_of(st.binary(max_size=80), texts.map(lambda s: s.encode("utf-8", "surrogatepass")))
headers = st.lists(
    st.tuples(st.one_of(texts, st.sampled_from(FAILURE_HEADERS)), st.one_of(st.none(), raw)),
    max_size=8,
)


@given(texts)
@example(HOSTILE)
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    assert text.isprintable() == (shown == text)


@given(
    st.recursive(
        st.none() | st.integers() | texts, lambda x: st.lists(x) | st.dictionaries(texts, x)
    )
)
def test_printable_json_decodes_to_the_same_value(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    shown = printable_json(text)
    assert shown.isprintable() and json.loads(shown) == value


@settings(max_examples=150, deadline=None)
@given(key=st.one_of(st.none(), raw), value=st.one_of(st.none(), raw), own=headers, meta=headers)
@example(key=HOSTILE.encode(), value=HOSTILE.encode(), own=[(HOSTILE, b"\x1b[31m")], meta=[])
def test_a_dead_letter_line_is_printable_whatever_the_record_holds(
    key: bytes | None, value: bytes | None, own: list[Any], meta: list[Any]
) -> None:
    source = Message(HOSTILE, 0, 3, 1_000, key, value, tuple(own))
    letter_headers = dead_letter_headers(
        source, ValueError(HOSTILE), stage="process", agent=HOSTILE, attempts=1, failed_at_ms=5
    )
    cut, letter_headers = fit_dead_letter(key, value, letter_headers, 200)
    # Anyone may write to the dead-letter topic: flowkit's own header names, any values.
    for written in (letter_headers, (*letter_headers, *meta), tuple(meta)):
        letter = DeadLetter(Message("app-dlq", 0, 1, 1_000, key, cut, written))
        assert letter.describe().isprintable(), letter.describe()


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(texts, st.integers()),
            st.recursive(st.none() | st.integers() | texts, lambda x: st.lists(x, max_size=3)),
        ),
        max_size=5,
    )
)
@example(rows=[(HOSTILE, HOSTILE)])
def test_a_table_row_is_printable_whatever_the_key_and_value(rows: list[Any]) -> None:
    listed = [{"key": k, "value": v} for k, v in rows]
    for line, (_, value) in zip(text_lines(listed), rows, strict=True):
        key_text, tab, shown = line.partition("\t")
        assert tab and key_text.isprintable() and shown.isprintable()
        assert json.loads(shown) == value
    whole = as_json_text(listed)
    assert whole.isprintable() and json.loads(whole) == listed
