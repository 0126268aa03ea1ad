"""How ``flowkit dlq show`` draws one dead letter: bytes escaped, the error type named once."""

from __future__ import annotations

import pytest

import flowkit
from flowkit.codecs import JsonCodec
from flowkit.deadletter import DeadLetter, dead_letter_headers
from flowkit.records import Message


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
