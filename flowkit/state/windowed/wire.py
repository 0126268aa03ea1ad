"""The windowed tables' wire format: what goes through the repartition topic and the
changelog, encoded and decoded in this one place.

Repartition topic (stage 1 -> owner), JSON arrays as values:

* ``["p", start, source, key, value]``: a source partition's partial of a closed window;
* ``["w", watermark, source, null, null]``: a source partition's watermark (to every owner).

Changelog keys (values are JSON; a None value deletes):

* ``["w"]``: a source partition's ``[watermark, max event time, announced watermark]``;
* ``["p", start, key]``: a stage-1 partial of an open window;
* ``["o", start, key, source]``: a partial held by the owner of an open window;
* ``["s", source]``: the watermark the owner holds for a source partition;
* ``["c", start, key]``: the final value of a closed window (until it expires);
* ``["e"]``: the offset of the last repartition record that closed windows, written before
  their results go out: after a crash, the windows that records up to there close again
  were emitted before (``Owners.replayed``).

>>> decode(partial(10_000, 2, "camp", 5))
['p', 10000, 2, 'camp', 5]
>>> key_from_json(["a", 1])
('a', 1)
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ...codecs import DECODE_FAILURES, decode_error_message
from ...errors import DecodeError

__all__ = [
    "EMITTED_KEY",
    "WATERMARK_KEY",
    "closed_key",
    "decode",
    "decode_record",
    "encode",
    "key_from_json",
    "marker",
    "owned_key",
    "partial",
    "partial_key",
    "source_key",
]

encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode
_REFUSED: tuple[type[Exception], ...] = (
    *DECODE_FAILURES,
    TypeError,
)  # TypeError: a key that cannot be hashed
_record = msgspec.json.Decoder(tuple[Literal["p", "w"], int, int, Any, Any]).decode


def decode_record(data: bytes, sources: int) -> tuple[str, int, int, Any, Any]:
    """A repartition record, checked: anyone who may write the topic may write anything
    there, so a record that is not a partial or marker of ``sources`` source partitions
    with a usable key raises ``DecodeError`` (the worker dead-letters it and goes on).

    >>> decode_record(partial(10_000, 1, ["a", 1], 5), sources=2)
    ('p', 10000, 1, ('a', 1), 5)
    >>> decode_record(b'["p", 0, 7, "k", 1]', sources=2)
    Traceback (most recent call last):
    ...
    flowkit.errors.DecodeError: not a repartition record: source partition 7 of 2
    """
    try:
        kind, a, source, key, value = _record(data)
        key = key_from_json(key)
        hash(key)  # a table key: a list inside a list is not one
    except _REFUSED as exc:
        raise DecodeError(f"not a repartition record: {decode_error_message(exc)}") from None
    if not 0 <= source < sources:
        raise DecodeError(f"not a repartition record: source partition {source} of {sources}")
    return kind, a, source, key, value


WATERMARK_KEY = b'["w"]'
EMITTED_KEY = b'["e"]'


def partial(start: int, source: int, key: Any, value: Any) -> bytes:
    """A repartition record carrying one partial."""
    return encode(("p", start, source, key, value))


def marker(watermark: int, source: int) -> bytes:
    """A repartition record carrying a source partition's watermark."""
    return encode(("w", watermark, source, None, None))


def partial_key(start: int, key: Any) -> bytes:
    """The changelog key of a stage-1 partial."""
    return encode(("p", start, key))


def owned_key(start: int, key: Any, source: int) -> bytes:
    """The changelog key of a partial held by its owner."""
    return encode(("o", start, key, source))


def source_key(source: int) -> bytes:
    """The changelog key of an owner's watermark for ``source``."""
    return encode(("s", source))


def closed_key(start: int, key: Any) -> bytes:
    """The changelog key of a closed window's final value."""
    return encode(("c", start, key))


def key_from_json(key: Any) -> Any:
    """A table key as it was before JSON: tuples come back as lists."""
    if isinstance(key, list):
        return tuple(key)
    return key
