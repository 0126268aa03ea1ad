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


def test_decode_batch_sets_failures_aside_and_keeps_order() -> None:
    topic: Topic[Order] = Topic("t", value_type=Order)
    good = [topic.encode(Order(id=str(i), amount=i)) for i in range(5)]
    messages = [msg(good[0], 0), msg(b"oops", 1), msg(good[2], 2), msg(None, 3), msg(good[4], 4)]
    batch = topic.decode_batch(messages)
    assert [v.amount for v in batch.values] == [0, 2, 4]
    assert [m.offset for m in batch.messages] == [0, 2, 4]
    assert [m.offset for m, _ in batch.failures] == [1, 3]
    assert "tombstone" in str(batch.failures[1][1])


def test_decode_batch_fast_path_shares_the_message_list() -> None:
    topic: Topic[int] = Topic("t", value_type=int)
    messages = [msg(b"1", 0), msg(b"2", 1)]
    batch = topic.decode_batch(messages)
    assert batch.values == [1, 2] and batch.messages is messages and not batch.failures


def test_keys_encode_as_utf8_and_undecodable_keys_stay_bytes() -> None:
    topic: Topic[int] = Topic("t", value_type=int)
    assert topic.encode_key("user-1") == b"user-1"
    assert topic.encode_key(None) is None
    assert topic.decode_key(b"\xff\xfe") == b"\xff\xfe"
    int_keys: Topic[int] = Topic("t", value_type=int, key_type=int)
    assert int_keys.decode_key(int_keys.encode_key(7)) == 7
