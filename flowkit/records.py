"""What flows: the user's ``Record`` base, the raw ``Message`` and the decoded ``Event``.

``Message`` is what a transport fetches and sends (bytes). ``Event`` is the decoded
envelope an agent sees through ``stream.events()``. ``Record`` is the base class of the
values users declare: a msgspec Struct, so decoding is one C call.
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

import msgspec

__all__ = ["Event", "Headers", "Message", "Record", "TopicPartition", "record_size"]

T = TypeVar("T")

Headers = tuple[tuple[str, bytes], ...]
"""Record headers: ordered (name, value) pairs; a name may repeat, as in Kafka."""


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """The bytes of a record's key, value and headers, as a producer's size limit counts
    them (less the few bytes of framing a broker adds).

    >>> record_size(b"k", b"value", (("h", b"12"),))
    9
    """
    size = (0 if key is None else len(key)) + (0 if value is None else len(value))
    for name, data in headers:
        size += len(name) + len(data)
    return size


class Record(msgspec.Struct, gc=False):
    """Base class for typed record values.

    Records are not tracked by Python's cycle collector (``gc=False``): a worker holds
    whole batches of them, and scanning those on every collection costs more than the
    records themselves. Don't build reference cycles through a record's fields; declare
    ``class MyRecord(flowkit.Record, gc=True)`` if you must.

    >>> class Click(Record):
    ...     user: str
    ...     url: str
    >>> Click(user="ann", url="/")
    Click(user='ann', url='/')
    """


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


class Message(msgspec.Struct, frozen=True, gc=False):
    """One record as a broker stores it: bytes plus where it sits in the log."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    """Milliseconds since the epoch (Kafka CreateTime)."""
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


class Event(msgspec.Struct, Generic[T], frozen=True):
    """A decoded record with its envelope, as ``stream.events()`` yields it."""

    value: T
    key: object
    headers: Headers
    topic: str
    partition: int
    offset: int
    timestamp: int
    """Milliseconds since the epoch."""

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None
