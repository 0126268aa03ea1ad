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
  were emitted before (``Owners.replayed``);
* ``["k"]``: on disk, ``[start, key]``: the last key of a closing window whose result a
  step of the owner's close sent, written before the results go out: after a crash, the
  keys up to there that close again were emitted before (``DiskOwners.step``).

A window that starts or ends (a sliding table's record: whose time is) more than
``max_future`` ahead of the wall clock is no record the table wrote (its source refused
the event time): ``decode_record`` and ``decode_change`` refuse it, given the table's
``FutureGuard``, as they refuse a record of the wrong shape. Held, it would stay for good
(it never closes).

>>> decode(partial(10_000, 2, "camp", 5))
['p', 10000, 2, 'camp', 5]
>>> key_from_json(["a", 1])
('a', 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NamedTuple

import msgspec

from ...codecs import DECODE_FAILURES, decode_error_message
from ...errors import DecodeError
from ...streamtime import FutureGuard, utc

__all__ = [
    "CURSOR_KEY",
    "EMITTED_KEY",
    "WATERMARK_KEY",
    "Shape",
    "closed_key",
    "decode",
    "decode_change",
    "decode_record",
    "encode",
    "key_from_json",
    "marker",
    "owned_key",
    "partial",
    "partial_key",
    "source_key",
    "too_far",
    "value_of",
]

encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode
_REFUSED: tuple[type[Exception], ...] = (
    *DECODE_FAILURES,
    TypeError,
)  # TypeError: a key that cannot be hashed
_record = msgspec.json.Decoder(tuple[Literal["p", "w"], int, int, Any, Any]).decode


def record_decoder(low: int, high: int) -> Callable[[bytes], Any]:
    """A decoder for ``decode_record`` whose records' times must lie strictly between
    ``low`` and ``high`` (checked as it decodes)."""
    timed = Annotated[int, msgspec.Meta(gt=low, lt=high)]
    return msgspec.json.Decoder(tuple[Literal["p", "w"], timed, int, Any, Any]).decode


def decode_record(
    data: bytes,
    sources: int,
    decode: Callable[[bytes], Any] = _record,
    guard: FutureGuard | None = None,
) -> tuple[str, int, int, Any, Any]:
    """A repartition record, checked: anyone who may write the topic may write anything
    there, so a record that is not a partial or marker of ``sources`` source partitions
    with a usable key, or a partial whose time is beyond ``guard`` (``too_far``), raises
    ``DecodeError`` (the worker dead-letters it and goes on).

    >>> decode_record(partial(10_000, 1, ["a", 1], 5), sources=2)
    ('p', 10000, 1, ('a', 1), 5)
    >>> decode_record(b'["p", 0, 7, "k", 1]', sources=2)
    Traceback (most recent call last):
    ...
    flowkit.errors.DecodeError: not a repartition record: source partition 7 of 2
    """
    try:
        kind, a, source, key, value = decode(data)
        key = key_from_json(key)
        hash(key)  # a table key: a list inside a list is not one
    except _REFUSED as exc:
        raise DecodeError(f"not a repartition record: {decode_error_message(exc)}") from None
    if not 0 <= source < sources:
        raise DecodeError(f"not a repartition record: source partition {source} of {sources}")
    if guard is not None and a > guard.future_limit and kind == "p" and not guard.admits(a):
        raise DecodeError(f"not a repartition record: {too_far(guard, a)}")
    return kind, a, source, key, value


def too_far(guard: FutureGuard, ms: int) -> str:
    """Why a window time ``ms`` beyond ``guard`` is refused.

    >>> guard = FutureGuard(3_600_000, now_ms=lambda: 0, owner="table 'counts'")
    >>> too_far(guard, 4_102_444_800_000)  # doctest: +NORMALIZE_WHITESPACE
    "a window at 2100-01-01 00:00:00 UTC (4102444800000 ms), more than max_future=3600 s
    ahead of the wall clock: table 'counts' holds none there"
    """
    return (
        f"a window at {utc(ms)} UTC ({ms} ms), more than max_future="
        f"{guard.max_future_ms / 1000:g} s ahead of the wall clock: {guard.owner} holds none there"
    )


WATERMARK_KEY = b'["w"]'
EMITTED_KEY = b'["e"]'
CURSOR_KEY = b'["k"]'


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


# -- changelog records, checked ----------------------------------------------------------


def value_of(kind: Any) -> Callable[[bytes], Any]:
    """The decoder of a changelog value of type ``kind`` (whole numbers are no bools)."""
    return msgspec.json.Decoder(kind).decode


class Shape(NamedTuple):
    """What a changelog record of one kind must be: its key's length, which of the key's
    items are whole numbers, which one is a source partition (checked against their
    count), which a table key (checked to be one), the decoder of its value, and which
    of the key's items is a window's start or a record's time, or how to find the latest
    window time in the value (each checked against the guard: ``too_far``)."""

    length: int
    ints: tuple[int, ...] = ()
    source: int | None = None
    key: int | None = None
    value: Callable[[bytes], Any] = decode
    time: int | None = None
    latest: Callable[[Any], int] | None = None


def decode_change(
    key: bytes,
    value: bytes | None,
    shapes: Mapping[str, Shape],
    sources: int,
    guard: FutureGuard | None = None,
) -> tuple[str, list[Any], Any]:
    """A changelog record, checked: anyone who may write the topic may write anything
    there, and a record a table cannot hold must not stop its recovery (a worker that
    stops on it would stop again at every restart). Returns its kind, its key's items
    and its value (None: deleted); raises ``DecodeError`` for a record that is not one
    of ``shapes`` (the worker dead-letters it and goes on).

    >>> shapes = {"s": Shape(2, ints=(1,), source=1, value=value_of(int))}
    >>> decode_change(source_key(1), b"5", shapes, sources=2)
    ('s', ['s', 1], 5)
    >>> decode_change(source_key(7), b"5", shapes, sources=2)
    Traceback (most recent call last):
    ...
    flowkit.errors.DecodeError: not a changelog record: source partition 7 of 2
    """
    try:
        parts = decode(key)
        shape = shapes.get(parts[0]) if type(parts) is list and parts else None
        if shape is not None and len(parts) == shape.length:
            if any(type(parts[i]) is not int for i in shape.ints):
                problem = f"{parts[0]!r} needs whole numbers at {list(shape.ints)}"
            elif shape.source is not None and not 0 <= parts[shape.source] < sources:
                problem = f"source partition {parts[shape.source]} of {sources}"
            elif (
                shape.time is not None
                and guard is not None
                and parts[shape.time] > guard.future_limit
                and not guard.admits(parts[shape.time])
            ):
                problem = too_far(guard, parts[shape.time])
            else:
                if shape.key is not None:
                    hash(key_from_json(parts[shape.key]))  # a list in a list is no key
                decoded = None if value is None else shape.value(value)
                if decoded is None or shape.latest is None or guard is None:
                    return parts[0], parts, decoded
                latest = shape.latest(decoded)
                if latest <= guard.future_limit or guard.admits(latest):
                    return parts[0], parts, decoded
                problem = too_far(guard, latest)
        else:
            problem = f"no key of this table: {key[:60]!r}"
    except _REFUSED as exc:
        problem = decode_error_message(exc)
    raise DecodeError(f"not a changelog record: {problem}")
