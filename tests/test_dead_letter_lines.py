"""How ``flowkit dlq show`` draws one dead letter: bytes escaped, the error type named once;
a dead letter anyone could have written (hostile headers) still reads and draws."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings

import flowkit
from flowkit.codecs import JsonCodec
from flowkit.deadletter import DeadLetter, dead_letter_headers
from flowkit.records import Message
from tests.hostile import hostile, hostile_msgpack


def _letter(value: bytes, error: BaseException) -> DeadLetter:
    source = Message("orders", 0, 3, 1_000, None, value, ())
    headers = dead_letter_headers(
        source, error, stage="decode", agent="check", attempts=1, failed_at_ms=1_700_000_000_000
    )
    return DeadLetter(Message("shop-dlq", 0, 0, 1_000, None, value, headers))


def _decode_error(data: bytes, type_: type = dict) -> flowkit.DecodeError:
    with pytest.raises(flowkit.DecodeError) as info:
        JsonCodec(type_).decode(data)
    return info.value


def test_bytes_that_are_not_utf8_show_escaped() -> None:
    raw = b"\xff\xfe{bad"
    line = _letter(raw, _decode_error(raw)).describe()
    assert line.endswith(r"value=\xff\xfe{bad")


def test_the_error_type_is_named_once() -> None:
    line = _letter(b"{bad", _decode_error(b"{bad")).describe()
    assert "DecodeError: JSON is malformed" in line
    assert line.count("DecodeError") == 1
    # A validation error keeps msgspec's type: it says which kind of decode error it was.
    wrong = _decode_error(b'"seven"', int)
    assert str(wrong) == "ValidationError: Expected `int`, got `str`"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile, meta=hostile_msgpack)
@example(value=b"x", meta=b"9" * 30)  # a number, but no date
@example(value=b"9" * 5_000, meta=b"-" + b"9" * 5_000)  # beyond int()'s digits
def test_a_hostile_dead_letter_reads_and_describes(value: bytes, meta: bytes) -> None:
    # Anyone may write to the dead-letter topic: its headers too, null values included.
    original = Message("orders", 0, 1, 0, b"k", b"v")
    headers = dict(
        dead_letter_headers(
            original, ValueError("x"), stage="process", agent="a", attempts=1, failed_at_ms=5
        )
    )
    for name in ("flowkit.source.partition", "flowkit.source.offset", "flowkit.failed_at"):
        headers[name] = meta
    headers["flowkit.value.size"] = value
    letter = DeadLetter(
        Message(
            "app-dlq",
            0,
            5,
            0,
            None,
            value,
            (*headers.items(), ("null", None), ("flowkit.stage", None)),
        )  # type: ignore[arg-type]
    )
    assert isinstance(letter.describe(), str)
    assert letter.matches({"partition": "1"}) in (True, False)
    assert isinstance(letter.original_size, int)
    assert isinstance(letter.source_offset, int) and isinstance(letter.failed_at_ms, int)
