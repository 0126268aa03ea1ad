"""Codecs turn values into bytes and back.

``Codec`` is the plug-in protocol. ``codec_for`` picks one from a type and a name
("json", "msgpack", "raw", "str"), so ``app.topic("t", value_type=Order)`` needs no codec
argument. Each codec builds its msgspec encoder and decoder once, at declaration. A
``CodecFormat`` (``flowkit.Avro(registry)``) is bound by the topic to its name and type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import msgspec

from .arguments import shown
from .errors import ConfigurationError, DecodeError, DefinitionError

__all__ = [
    "Codec",
    "CodecFormat",
    "JsonCodec",
    "MsgpackCodec",
    "RawCodec",
    "StrCodec",
    "codec_for",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


# What a decoder raises for bytes it cannot read, besides msgspec's own errors (its
# ValidationError among them): nesting deeper than the interpreter's recursion limit
# (msgspec raises RecursionError, for a value of any type with lists or objects, or a record
# skipping an unknown field), a value too big for memory, and from hand-written decoders
# and msgspec's hooks ValueError (UnicodeDecodeError is one) and OverflowError. Each is the
# record's fault, not a bug: a DecodeError, dead-lettered at stage "decode", never retried.
DECODE_FAILURES: tuple[type[Exception], ...] = (
    msgspec.DecodeError,
    RecursionError,
    MemoryError,
    ValueError,
    OverflowError,
)


def decode_error_message(exc: BaseException) -> str:
    """What a ``DecodeError`` says about ``exc``, a decoder's error, naming its type once.

    msgspec's own ``DecodeError`` (malformed bytes) would read "DecodeError: DecodeError: ..."
    once wrapped, so only its message is kept; other types (``ValidationError``) are named.
    """
    if type(exc) is msgspec.DecodeError:
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@runtime_checkable
class Codec(Protocol[T]):
    """Encodes a value to bytes and decodes bytes to a value.

    ``decode`` raises ``flowkit.DecodeError`` for bytes it cannot read. Whatever else it
    raises is taken as a ``DecodeError`` too: the record does not decode.
    """

    def encode(self, value: T, /) -> bytes: ...

    def decode(self, data: bytes, /) -> T: ...


@runtime_checkable
class CodecFormat(Protocol):
    """A codec not yet bound to a topic: the topic makes its codec from its own name and
    type (a Schema Registry format names its subject after the topic).

    A codec it makes may have a ``verify() -> list[str]`` method: what a worker checks at
    start, and ``flowkit graph --check`` too, against what lies outside the app (the
    registry's schemas), one line per problem; and an ``internal_codec``, which the app's
    own internal topics for the same values (a ``group_by`` hop) use instead.
    """

    def for_topic(self, topic: str, type_: Any, /, *, key: bool = False) -> Codec[Any]: ...


class _MsgspecCodec(Generic[T]):
    """What the msgspec codecs share: an encoder and a decoder built once (by the codec's
    ``__init__``), and the decoder's errors mapped to ``DecodeError``."""

    _encoder: msgspec.json.Encoder | msgspec.msgpack.Encoder
    _decoder: msgspec.json.Decoder[T] | msgspec.msgpack.Decoder[T]

    def encode(self, value: T, /) -> bytes:
        return self._encoder.encode(value)

    def decode(self, data: bytes, /) -> T:
        try:
            return self._decoder.decode(data)
        except DECODE_FAILURES as exc:
            raise DecodeError(decode_error_message(exc)) from None

    @property
    def raw_decode(self) -> Callable[[bytes], T]:
        """msgspec's own ``decode``, without the error mapping: for loops over many
        records (table recovery) that fall back to ``decode`` when anything fails."""
        return self._decoder.decode


class JsonCodec(_MsgspecCodec[T]):
    """JSON through msgspec, validated against ``type``.

    >>> JsonCodec(int).decode(b"42")
    42
    >>> JsonCodec(list).decode(b"[" * 10_000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    flowkit.errors.DecodeError: RecursionError: maximum recursion depth exceeded...
    """

    name = "json"

    def __init__(self, type: type[T] | Any = Any) -> None:
        self.type = type
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(type)


class MsgpackCodec(_MsgspecCodec[T]):
    """MessagePack through msgspec, validated against ``type``."""

    name = "msgpack"

    def __init__(self, type: type[T] | Any = Any) -> None:
        self.type = type
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(type)


class RawCodec:
    """Bytes in, bytes out."""

    name = "raw"
    type = bytes

    def encode(self, value: bytes, /) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"raw codec needs bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes, /) -> bytes:
        return data


class StrCodec:
    """UTF-8 text, the usual form of Kafka string keys (no JSON quotes)."""

    name = "str"
    type = str

    def encode(self, value: str, /) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"str codec needs str, got {type(value).__name__}")
        return value.encode()

    def decode(self, data: bytes, /) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8: {exc}") from None

    raw_decode = staticmethod(bytes.decode)
    """``bytes.decode`` itself, without the error mapping (see ``JsonCodec``)."""


def codec_for(
    type_: Any,
    codec: str | Codec[Any] | CodecFormat | None = None,
    *,
    what: str = "type",
    topic: str | None = None,
    key: bool = False,
) -> Codec[Any]:
    """The codec for values of ``type_``: ``codec`` if it is one, else by name or type.

    With no name, ``bytes`` gets the raw codec, ``str`` gets UTF-8 text and every other
    type JSON. A ``type_`` the codec cannot decode into is a ``DefinitionError`` that
    names it as ``what`` says:

    >>> codec_for(str).encode("k")
    b'k'
    >>> codec_for(5, what="value_type")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flowkit.errors.DefinitionError: value_type must be a type json can decode (...), not int 5

    A ``CodecFormat`` is bound to ``topic`` (the value codec, or the key codec with ``key``).
    """
    if isinstance(codec, CodecFormat) and not isinstance(codec, Codec):
        if topic is None:
            raise DefinitionError(f"{what}: {codec!r} is a topic's codec (app.topic)")
        return codec.for_topic(topic, type_, key=key)
    try:
        return _codec_for(type_, codec)
    except TypeError:  # msgspec: "Type '5' is not supported"
        name = codec if isinstance(codec, str) else "json"
        raise DefinitionError(
            f"{what} must be a type {name} can decode (int, str, a flowkit.Record, "
            f"list[int], ...), not {shown(type_)}"
        ) from None


def _codec_for(type_: Any, codec: str | Codec[Any] | CodecFormat | None) -> Codec[Any]:
    if codec is not None and not isinstance(codec, str):
        if not isinstance(codec, Codec):
            raise ConfigurationError(f"codec {codec!r} has no encode/decode methods")
        return codec
    if codec is None:
        if type_ is bytes:
            return RawCodec()
        if type_ is str:
            return StrCodec()
        return JsonCodec(type_)
    if codec == "raw":
        return RawCodec()
    if codec == "str":
        return StrCodec()
    if codec == "json":
        return JsonCodec(type_)
    if codec == "msgpack":
        return MsgpackCodec(type_)
    raise ConfigurationError(
        f"unknown codec {codec!r}: use 'json', 'msgpack', 'raw', 'str' or a Codec"
    )
