"""Hostile bytes through every decoder: a value, or a ``DecodeError``, never anything else.

Nesting deeper than the interpreter's recursion limit makes msgspec raise
``RecursionError``; numbers out of range, NaN, text that is not UTF-8 and truncated
records raise its own errors; a custom codec raises what it likes. Each is the record's
failure, not a bug: a ``DecodeError`` (a key that does not decode stays its bytes).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

import flowkit
from flowkit.codecs import JsonCodec, MsgpackCodec, RawCodec, StrCodec
from flowkit.records import Message
from flowkit.topics import Topic
from tests.hostile import hostile, hostile_json

HOSTILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Order(flowkit.Record):
    id: str
    amount: int


def decodes_or_fails_cleanly(decode: Any, data: bytes) -> None:
    try:
        value = decode(data)
    except flowkit.DecodeError as exc:
        assert str(exc)  # says why
    else:
        assert value is not None or data.strip() == b"null" or data == b"\xc0"


CODECS = {
    "json Any": JsonCodec(Any),
    "json Order": JsonCodec(Order),
    "json int": JsonCodec(int),
    "json float": JsonCodec(float),
    "json list": JsonCodec(list[Any]),
    "json dict": JsonCodec(dict[str, Any]),
    "msgpack Any": MsgpackCodec(Any),
    "msgpack Order": MsgpackCodec(Order),
    "str": StrCodec(),
}


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
@HOSTILE
@given(data=hostile)
def test_every_codec_decodes_hostile_bytes_or_raises_a_decode_error(
    codec: Any, data: bytes
) -> None:
    decodes_or_fails_cleanly(codec.decode, data)


@pytest.mark.parametrize(
    ("codec", "data"),
    [
        (JsonCodec(Any), b"[" * 1_000 + b"]" * 1_000),
        (JsonCodec(list[Any]), b"[" * 100_000),
        (JsonCodec(dict[str, Any]), b'{"a":' * 5_000 + b"1" + b"}" * 5_000),
        (MsgpackCodec(Any), b"\x91" * 100_000 + b"\xc0"),
    ],
    ids=["json 1,000", "json 100,000 unclosed", "json objects", "msgpack 100,000"],
)
def test_deep_nesting_is_a_decode_error(codec: Any, data: bytes) -> None:
    # msgspec raises RecursionError: the bytes' fault, not the program's.
    with pytest.raises(flowkit.DecodeError, match="RecursionError"):
        codec.decode(data)


def test_raw_bytes_take_anything() -> None:
    assert RawCodec().decode(b"[" * 100_000) == b"[" * 100_000


@HOSTILE
@given(data=hostile_json)
def test_the_stream_decoder_maps_every_failure_to_a_decode_error(data: bytes) -> None:
    topic: Topic[Order] = Topic("t", value_type=Order)
    decode = topic.decoder()  # msgspec's own: raises its errors, and RecursionError
    try:
        decode(data)
    except Exception as exc:
        assert isinstance(topic.decode_error(exc), flowkit.DecodeError)
    decodes_or_fails_cleanly(topic.decode, data)


@pytest.mark.parametrize("key_type", [int, Any, Order, str, bytes], ids=lambda t: str(t))
@HOSTILE
@given(data=hostile)
def test_a_key_that_does_not_decode_stays_its_bytes(key_type: Any, data: bytes) -> None:
    topic: Topic[int] = Topic("t", value_type=int, key_type=key_type)
    key = topic.decode_key(data)
    if isinstance(key, bytes):
        return
    assert topic.key_codec.decode(data) == key or (isinstance(key, float) and math.isnan(key))


class Touchy:
    """A custom codec that fails the way hand-written decoders do."""

    name = "touchy"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def encode(self, value: Any) -> bytes:
        return msgspec.json.encode(value)

    def decode(self, data: bytes) -> Any:
        raise self.error


CUSTOM_FAILURES = [
    ValueError("not a number"),
    UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    OverflowError("too big"),
    RecursionError("maximum recursion depth exceeded"),
    MemoryError(),
    KeyError("payload"),
]


@pytest.mark.parametrize("error", CUSTOM_FAILURES, ids=lambda e: type(e).__name__)
def test_what_a_custom_codec_raises_is_a_decode_error_for_a_value_and_bytes_for_a_key(
    error: Exception,
) -> None:
    topic: Topic[Any] = Topic("t", codec=Touchy(error), key_codec=Touchy(error))
    with pytest.raises(flowkit.DecodeError, match=type(error).__name__):
        topic.decode(b"x")
    decode = topic.decoder()  # (what the stream loop calls: it maps what this raises)
    with pytest.raises(Exception) as raised:
        decode(b"x")
    assert isinstance(topic.decode_error(raised.value), flowkit.DecodeError)
    assert topic.decode_key(b"k") == b"k"


# -- table changelogs ----------------------------------------------------------------------


def _changelog(*pairs: tuple[bytes | None, bytes | None]) -> list[Message]:
    return [Message("c", 0, i, 0, k, v) for i, (k, v) in enumerate(pairs)]


@pytest.mark.parametrize("value_type", [int, Any, Order], ids=["int", "Any", "Order"])
@pytest.mark.parametrize("key_type", [str, int, Any], ids=["str keys", "int keys", "Any keys"])
@HOSTILE
@given(data=hostile_json)
def test_a_hostile_changelog_record_is_a_decode_error(
    key_type: Any, value_type: Any, data: bytes
) -> None:
    app = flowkit.App("shop", partitions=1)
    store = app.table("totals", key_type=key_type, value_type=value_type).new_store(
        now_ms=lambda: 0
    )
    store.assign([0])
    for records in (_changelog((b"1", data)), _changelog((data, b"1"))):
        try:
            store.apply_changelog(0, records)
        except flowkit.DecodeError:
            pass


def test_a_deeply_nested_changelog_record_is_a_decode_error() -> None:
    store = flowkit.App("shop", partitions=1).table("totals").new_store(now_ms=lambda: 0)
    store.assign([0])
    store.apply_changelog(0, _changelog((b"a", b"1"), (b"b", b"[" * 10_000)))
    assert dict(store.items()) == {"a": 1}
    ((_, error),) = store.rejected  # dead-lettered by the worker
    assert isinstance(error, flowkit.DecodeError) and "RecursionError" in str(error)
