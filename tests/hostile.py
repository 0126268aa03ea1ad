"""Hypothesis strategies for hostile bytes: what anyone with produce rights can write.

Deep nesting (1,000 to 100,000 levels, closed or not), numbers no type holds, NaN and
Infinity, text that is not UTF-8, truncated records, and any bytes at all; in JSON and in
MessagePack.
"""

from __future__ import annotations

import msgspec
from hypothesis import strategies as st

__all__ = ["hostile", "hostile_json", "hostile_msgpack"]

DEPTHS = st.integers(1_000, 100_000)


@st.composite
def _deep_json(draw: st.DrawFn) -> bytes:
    depth = draw(DEPTHS)
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'[{"k":', b"}]")]))
    inner = draw(st.sampled_from([b"1", b"null", b'"x"', b"[]"]))
    closed = draw(st.booleans())
    return opener * depth + inner + (closer * depth if closed else b"")


@st.composite
def _deep_msgpack(draw: st.DrawFn) -> bytes:
    depth = draw(DEPTHS)
    opener = draw(st.sampled_from([b"\x91", b"\x81\xa1a", b"\xdc\x00\x01"]))  # [x], {"a": x}
    return opener * depth + draw(st.sampled_from([b"\xc0", b"\x01", b""]))


_numbers = st.one_of(
    st.integers(20, 100_000).map(lambda n: b"9" * n),  # beyond 64 bits, beyond str->int
    st.integers(20, 5_000).map(lambda n: b"-" + b"9" * n),
    st.sampled_from([b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1e-999"]),
    st.integers(20, 2_000).map(lambda n: b'{"id": "a", "amount": ' + b"9" * n + b"}"),
    st.sampled_from([b'{"id": "a", "amount": NaN}', b'{"id": "a", "amount": 1e400}']),
)

_not_utf8 = st.one_of(
    st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]),
    st.binary(min_size=1, max_size=16).map(lambda b: b'"' + b"\xff" + b + b'"'),
    st.binary(min_size=1, max_size=16).map(lambda b: b'{"id": "\xc0' + b + b'", "amount": 1}'),
)

_valid_json = [
    msgspec.json.encode({"id": "order-1", "amount": 12}),
    msgspec.json.encode([1, 2, {"a": [3, 4]}]),
    msgspec.json.encode("a string"),
]


@st.composite
def _truncated(draw: st.DrawFn, valid: list[bytes]) -> bytes:
    data = draw(st.sampled_from(valid))
    return data[: draw(st.integers(0, len(data) - 1))]


hostile_json = st.one_of(
    _deep_json(),
    _numbers,
    _not_utf8,
    _truncated(_valid_json),
    st.binary(max_size=64),
)

hostile_msgpack = st.one_of(
    _deep_msgpack(),
    _truncated([msgspec.msgpack.encode({"id": "order-1", "amount": 12})]),
    st.sampled_from([b"\xdd\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xa2\xff\xfe"]),
    st.binary(max_size=64),
)

hostile = st.one_of(hostile_json, hostile_msgpack)
