"""Where a published record waits to be sent: its topic's ``Lane``, in its partition's group.

The rules of placing an output are written here once, and every sender uses them (an
agent's outputs, dead letters, the publisher's own ``place``):

- a record's size, as a producer's limit counts it, is ``records.record_size``;
- a key's partition is Kafka's default partitioner (``partition_for_key``), remembered per
  key in a ``KeyPartitions`` shared by the lanes of one partition count, so a record
  fanned out to several topics is hashed once; a keyless record goes to the lane's
  partition of the round (``spread``), which moves on each round;
- a record goes to its partition's group as soon as the topic's partition count is known
  (``add``, ``put``), so a flush has nothing left to group; until then it waits ``loose``.

The last two are one piece of source text, ``PLACE`` (its partition choice ``PARTITION``,
which ``Lane.partition`` is compiled from too): ``Lane.add`` and ``Lane.put`` are
compiled from it here, and the emitter's fan-out loop has it written in (``fanout.py``),
so an output costs no call and the rule is still written once.

What caused a record travels beside it (its origin), typed: an agent output's ``Origin``
(or ``RawOrigin`` for a client's own record), a dead letter's letter, or None.
"""

from __future__ import annotations

import linecache
from typing import TYPE_CHECKING, Any

from ...partitioning import partition_for_key
from ...records import Headers, Origin, RawOrigin, record_size
from ...transports import OutRecord

__all__ = ["Group", "KeyPartitions", "Lane", "Origin", "RawOrigin", "settled"]

_KEY_CACHE = 100_000  # keys whose partition is remembered, per partition count

Group = tuple[list[OutRecord], list[object]]
"""The records waiting for one partition, and beside them what caused each."""


def settled(origin: object) -> object:
    """An output's origin as ``on_rejected`` and sinks take it: an ``Origin`` for a
    ``RawOrigin`` (its ``Message`` made now); any other origin as it is.

    >>> from flowkit.records import Message
    >>> m = Message("t", 0, 7, 0, None, b"v")
    >>> settled(RawOrigin(("t", 7), "agent", lambda r: m)) == Origin(m, "agent")
    True
    >>> settled(None) is None
    True
    """
    if isinstance(origin, RawOrigin):
        return Origin(origin.convert(origin.record), origin.agent)
    return origin


class KeyPartitions(dict[bytes, int]):
    """Key -> partition among ``count`` partitions, computed on first use and remembered:
    the one place a key's partition is found (``keys[key]`` is a dict hit after the first).

    >>> keys = KeyPartitions(4)
    >>> keys[b"foobar"], b"foobar" in keys
    (2, True)
    """

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def __missing__(self, key: bytes) -> int:
        if len(self) >= _KEY_CACHE:
            self.clear()  # in place: the lanes of this count hold this same dict
        p = self[key] = partition_for_key(key, self.count)
        return p


# A record that fits, placed in its partition's group (``parts``, the lane's list of
# groups): a key's partition from the shared cache, a keyless record's the round's. The
# names in braces are the placing code's own; ``place_source`` fills them in.
PARTITION = "{lane}.spread if {key} is None else {lane}.keys[{key}]"
"""The partition of a record with ``key`` on ``lane`` (whose partition count is known)."""

PLACE = (
    "group = parts["
    + PARTITION
    + """]
group[0].append(({key}, {value}, {headers}, {timestamp}))
group[1].append({origin})"""
)


def place_source(
    indent: int,
    *,
    lane: str = "self",
    key: str = "key",
    value: str = "value",
    headers: str = "headers",
    timestamp: str = "timestamp_ms",
    origin: str = "origin",
) -> str:
    """``PLACE`` with the placing code's names, indented by ``indent`` spaces.

    >>> lane = Lane("t", 100)
    >>> lane.known(4, KeyPartitions(4))
    >>> lane.partition(b"foobar"), lane.partition(None)
    (2, 0)
    >>> print(place_source(0, lane="lane", timestamp="None"))
    group = parts[lane.spread if key is None else lane.keys[key]]
    group[0].append((key, value, headers, None))
    group[1].append(origin)
    """
    names = {"lane": lane, "key": key, "value": value, "headers": headers}
    text = PLACE.format(**names, timestamp=timestamp, origin=origin)
    return "\n".join(" " * indent + line for line in text.splitlines())


def compiled(name: str, src: str, namespace: dict[str, Any]) -> Any:
    """The function ``name`` defined by ``src``, compiled with ``namespace`` as its globals
    and registered with ``linecache`` (a traceback through it shows its lines)."""
    filename = f"<flowkit {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), namespace)
    return namespace[name.rpartition(" ")[2]]


_ADD = f"""\
def add(self, key, value, headers, origin, timestamp_ms=None):
    parts = self.parts
    if parts is None or record_size(key, value, headers) > self.limit:
        return False
{place_source(4)}
    return True
"""

_PARTITION = f"""\
def partition(self, key):
    return {PARTITION.format(lane="self", key="key")}
"""

_PUT = f"""\
def put(self, key, value, headers, origin, timestamp_ms=None):
    parts = self.parts
    if parts is None:
        group = self.loose
        group[0].append((key, value, headers, timestamp_ms))
        group[1].append(origin)
        return
{place_source(4)}
"""


class Lane:
    """The records published to one topic and not sent yet, placed by partition.

    Once the topic's partition count is known, ``parts[p]`` holds partition ``p``'s records
    and their origins; until then (the first records to a topic) ``parts`` is None and
    records wait in ``loose``, placed by the flush that asks for the count. ``limit`` is
    the producer's size limit: ``add`` places only a record within it.

    >>> lane = Lane("t", 10)
    >>> lane.add(b"k", b"v", (), None)
    False
    >>> lane.known(1, KeyPartitions(1))
    >>> lane.add(b"k", b"v", (), None), lane.add(b"k", b"v" * 10, (), None)
    (True, False)
    >>> lane.parts
    [([(b'k', b'v', (), None)], [None])]
    """

    __slots__ = ("count", "keys", "limit", "loose", "parts", "spread", "topic")

    def __init__(self, topic: str, limit: int) -> None:
        self.topic = topic
        self.limit = limit
        self.count: int | None = 0  # 0: not known yet; None: the producer places records
        self.parts: list[Group] | None = None
        self.loose: Group = ([], [])
        self.keys = KeyPartitions(1)  # replaced by ``known``
        self.spread = 0

    def known(self, count: int, keys: KeyPartitions) -> None:
        """The topic has ``count`` partitions (``keys`` is the shared cache for that
        count): from now on records are placed in their partition's group at once."""
        self.count, self.keys = count, keys
        self.parts = [([], []) for _ in range(count)]

    if TYPE_CHECKING:

        def partition(self, key: bytes | None) -> int:
            """The partition a record with ``key`` goes to (the count is known)."""

        def add(
            self,
            key: bytes | None,
            value: bytes | None,
            headers: Headers,
            origin: object,
            timestamp_ms: int | None = None,
        ) -> bool:
            """Place one record in its partition's group; False, and nothing placed, while
            the partition count is not known or for a record over the size limit (the
            publisher then takes it, and says why it refuses one)."""

        def put(
            self,
            key: bytes | None,
            value: bytes | None,
            headers: Headers,
            origin: object,
            timestamp_ms: int | None = None,
        ) -> None:
            """Place one record whose size its sender has checked: in its partition's
            group, or ``loose`` while the count is not known."""

    else:  # compiled from ``PLACE``, the rule's one statement
        partition = compiled("lane partition", _PARTITION, {})
        add = compiled("lane add", _ADD, {"record_size": record_size})
        put = compiled("lane put", _PUT, {})

    def queued(self) -> bool:
        """True if records wait to be sent."""
        if self.loose[0]:
            return True
        return self.parts is not None and any(records for records, _ in self.parts)

    def take(self) -> tuple[Group, list[tuple[int, list[OutRecord], list[object]]]]:
        """The waiting records (loose, and per partition), leaving the lane empty."""
        loose = self.loose
        if loose[0]:
            self.loose = ([], [])
        placed: list[tuple[int, list[OutRecord], list[object]]] = []
        parts = self.parts
        if parts is not None:
            for p, (records, origins) in enumerate(parts):
                if records:
                    placed.append((p, records, origins))
                    parts[p] = ([], [])
            if placed:
                self.spread = (self.spread + 1) % len(parts)  # keyless: one partition a round
        return loose, placed
