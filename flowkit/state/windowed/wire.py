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
* ``["c", start, key]``: the final value of a closed window (until it expires).

>>> decode(partial(10_000, 2, "camp", 5))
['p', 10000, 2, 'camp', 5]
>>> key_from_json(["a", 1])
('a', 1)
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "WATERMARK_KEY",
    "closed_key",
    "decode",
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

WATERMARK_KEY = b'["w"]'


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
