from __future__ import annotations

from typing import Any

import pytest

import flowkit
from flowkit.codecs import JsonCodec, MsgpackCodec, RawCodec, StrCodec, codec_for
from flowkit.records import Message
from flowkit.topics import Topic


class Order(flowkit.Record):
    id: str
    amount: int


def msg(value: bytes | None, offset: int = 0) -> Message:
    return Message("t", 0, offset, 0, None, value)


@pytest.mark.parametrize("codec", [JsonCodec(Order), MsgpackCodec(Order)])
def test_struct_round_trip(codec: Any) -> None:
    order = Order(id="a", amount=3)
    assert codec.decode(codec.encode(order)) == order


@pytest.mark.parametrize(
    "data",
    [b"{", b'{"id": "a"}', b'{"id": 1, "amount": 2}', b"[]", b"\xff"],
    ids=["truncated", "missing-field", "wrong-type", "wrong-shape", "not-utf8"],
)
def test_json_decode_errors_are_flowkit_errors(data: bytes) -> None:
    with pytest.raises(flowkit.DecodeError):
        JsonCodec(Order).decode(data)


def test_raw_and_str_codecs() -> None:
    assert RawCodec().decode(b"\x00\x01") == b"\x00\x01"
    assert StrCodec().encode("ключ") == "ключ".encode()
    with pytest.raises(flowkit.DecodeError):
        StrCodec().decode(b"\xff")
    with pytest.raises(TypeError):
        RawCodec().encode("text")  # type: ignore[arg-type]


def test_codec_for_picks_by_type_and_name() -> None:
    assert isinstance(codec_for(bytes), RawCodec)
    assert isinstance(codec_for(str), StrCodec)
    assert isinstance(codec_for(Order), JsonCodec)
    assert isinstance(codec_for(Order, "msgpack"), MsgpackCodec)
    custom = JsonCodec(int)
    assert codec_for(Order, custom) is custom
    with pytest.raises(flowkit.ConfigurationError, match="unknown codec 'xml'"):
        codec_for(Order, "xml")
    with pytest.raises(flowkit.ConfigurationError):
        codec_for(Order, object())  # type: ignore[arg-type]


def test_the_stream_decoder_and_its_errors() -> None:
    topic: Topic[Order] = Topic("t", value_type=Order)
    decode = topic.decoder()  # what the stream loop calls per record
    assert decode(topic.encode(Order(id="1", amount=1))) == Order(id="1", amount=1)
    failures = []
    for bad in (b"oops", None, b'{"id": 1}'):
        try:
            decode(bad)
        except Exception as exc:
            failures.append(topic.decode_error(exc))
    assert [type(e) for e in failures] == [flowkit.DecodeError] * 3
    assert "tombstone" in str(failures[1])
    assert "malformed" in str(failures[0]) or "JSON" in str(failures[0])


def test_keys_encode_as_utf8_and_undecodable_keys_stay_bytes() -> None:
    topic: Topic[int] = Topic("t", value_type=int)
    assert topic.encode_key("user-1") == b"user-1"
    assert topic.encode_key(None) is None
    assert topic.decode_key(b"\xff\xfe") == b"\xff\xfe"
    int_keys: Topic[int] = Topic("t", value_type=int, key_type=int)
    assert int_keys.decode_key(int_keys.encode_key(7)) == 7
