"""What flows: the user's ``Record`` base, the raw ``Message`` and the decoded ``Event``.

``Message`` is what a transport fetches and sends (bytes). ``Event`` is the decoded
envelope an agent sees through ``stream.events()``. ``Record`` is the base class of the
values users declare: a msgspec Struct, so decoding is one C call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, TypeVar, overload

import msgspec

__all__ = [
    "Event",
    "Headers",
    "Message",
    "Origin",
    "RawMessages",
    "RawOrigin",
    "Record",
    "TopicPartition",
    "headers_size",
    "record_size",
]

T = TypeVar("T")

Headers = tuple[tuple[str, bytes | None], ...]
"""Record headers: ordered (name, value) pairs, as in Kafka: a name may repeat, and a value
may be null (None), which is not the same as empty (``b""``)."""


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """The bytes of a record's key, value and headers, as a producer's size limit counts
    them (less the few bytes of framing a broker adds).

    >>> record_size(b"k", b"value", (("h", b"12"), ("null", None)))
    13
    """
    size = (0 if key is None else len(key)) + (0 if value is None else len(value))
    return size + headers_size(headers) if headers else size


def headers_size(headers: Headers) -> int:
    """The bytes of ``headers`` as a producer counts them: each name in UTF-8 and each
    value (a null value has none). The one place this rule is written.

    >>> headers_size((("trace", b"abc"), ("é", None)))
    10
    """
    size = 0
    for name, data in headers:
        size += len(name) if name.isascii() else len(name.encode("utf-8", "surrogatepass"))
        if data is not None:
            size += len(data)
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


class RawMessages(Sequence[Message]):
    """The records of one partition as a client returned them, each made a ``Message`` only
    when it is asked for; a transport's ``getmany`` may return these instead of a list.

    Most records are only decoded: the stream loop reads their values straight from
    ``raw`` through ``value_of`` and never builds a ``Message`` (on librdkafka that saved
    most of a microsecond a record, docs/benchmarks.md). Offsets, keys, timestamps and
    headers are read for a few records a batch (its ends, a dead letter's record), and each
    of those is made once; an agent's outputs read their record's key through ``key_of``
    (and make its ``Message`` only if a send is refused), a windowed table its time through
    ``timestamp_of``.

    >>> raw = [(b"a", 7), (b"b", 8)]
    >>> run = RawMessages(raw, lambda r: r[0], lambda r: Message("t", 0, r[1], 0, None, r[0]))
    >>> [run.value_of(r) for r in run.raw], run[-1].offset, len(run)
    ([b'a', b'b'], 8, 2)
    >>> run[1] is run[-1]
    True
    >>> run.key_of(raw[0]) is None
    True
    """

    __slots__ = ("_made", "convert", "key_of", "raw", "timestamp_of", "value_of")

    def __init__(
        self,
        raw: list[Any],
        value_of: Callable[[Any], bytes | None],
        convert: Callable[[Any], Message],
        key_of: Callable[[Any], bytes | None] | None = None,
        timestamp_of: Callable[[Any], int] | None = None,
    ) -> None:
        self.raw = raw
        self.value_of = value_of
        self.convert = convert
        # A record's key and timestamp through the client, without a Message (an agent's
        # outputs read the key, a windowed table without time= the timestamp).
        self.key_of = key_of if key_of is not None else lambda r: convert(r).key
        self.timestamp_of = (
            timestamp_of if timestamp_of is not None else lambda r: convert(r).timestamp
        )
        # The Messages made so far, by index: asking twice gives the same object.
        self._made: dict[int, Message] = {}

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, i: int) -> Message: ...

    @overload
    def __getitem__(self, i: slice) -> list[Message]: ...

    def __getitem__(self, i: int | slice) -> Message | list[Message]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.raw)))]
        made = self._made.get(i)
        if made is None:
            raw = self.raw
            if i < 0:  # one Message per record, however its index is written
                i += len(raw)
                if i < 0:
                    raise IndexError("RawMessages index out of range")
            made = self._made.get(i)
            if made is None:
                made = self._made[i] = self.convert(raw[i])
        return made

    def __iter__(self) -> Iterator[Message]:
        if not self._made:
            return map(self.convert, self.raw)
        return (self[i] for i in range(len(self.raw)))

    def __repr__(self) -> str:
        return f"RawMessages({list(self)!r})"


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


class Origin(msgspec.Struct, frozen=True, gc=False):
    """What caused an agent's output: its record and the agent (built in C: one a record)."""

    message: Message
    agent: str


class RawOrigin(msgspec.Struct, frozen=True, gc=False):
    """An ``Origin`` whose record is a client's own (librdkafka's, in a ``RawMessages``
    batch): its ``Message`` is made only by ``settled``, for the rare output that is refused
    or goes to a sink."""

    record: object
    agent: str
    convert: Callable[[Any], Message]
