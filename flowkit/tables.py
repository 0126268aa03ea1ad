"""Tables: partitioned key -> value state, in memory, backed by a changelog topic.

A ``Table`` is partitioned like the topics that feed it (co-partitioning): key ``k`` lives
in partition ``partition_for_key(k)``, the same partition Kafka's producer would put a
record with that key in. Each partition's state is a dict. Changes are buffered and the
latest value per changed key is written to the changelog ``<app>-<table>-changelog`` once
per checkpoint, before offsets are committed; when a partition is assigned, its dict is
rebuilt from the changelog before any record of that partition is processed.

A ``GlobalTable`` is held whole by every worker, fed from its own topic: reference data
such as an ad -> campaign mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .codecs import Codec, codec_for
from .errors import DefinitionError, NotRunningError
from .partitioning import partition_for_key
from .records import Message
from .streams import active_source

if TYPE_CHECKING:
    from .topics import Topic
    from .windowed import WindowedTable
    from .windows import WindowSpec

__all__ = ["GlobalTable", "Table", "TableBase"]

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


class TableBase(Generic[K, V]):
    """What every table shares: name, codecs, partitioning, and a changelog topic."""

    kind = "table"

    def __init__(
        self,
        name: str,
        *,
        app_name: str,
        partitions: int,
        default: Callable[[], V] | None = None,
        key_type: Any = str,
        value_type: Any = Any,
        key_codec: str | Codec[Any] | None = None,
        value_codec: str | Codec[Any] | None = None,
    ) -> None:
        if partitions < 1:
            raise DefinitionError(f"table {name!r}: partitions must be >= 1")
        if default is not None and not callable(default):
            raise DefinitionError(f"table {name!r}: default must be callable, like int or list")
        self.name = name
        self.app_name = app_name
        self.partitions = partitions
        self.default = default
        self.key_type = key_type
        self.value_type = value_type
        self.key_codec: Codec[Any] = codec_for(key_type, key_codec)
        self.value_codec: Codec[Any] = codec_for(value_type, value_codec or "json")
        self._key_partition: dict[Any, int] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} partitions={self.partitions}>"

    @property
    def changelog_topic(self) -> str:
        """The compacted topic that holds this table's latest values."""
        return f"{self.app_name}-{self.name}-changelog"

    def partition_of(self, key: K) -> int:
        """The partition that owns ``key`` (Kafka's murmur2 of the encoded key)."""
        p = self._key_partition.get(key)
        if p is None:
            raw = key if isinstance(key, bytes) else self.key_codec.encode(key)
            p = self._key_partition[key] = partition_for_key(raw, self.partitions)
        return p

    def encode_key(self, key: K) -> bytes:
        """The changelog key bytes."""
        return key if isinstance(key, bytes) else self.key_codec.encode(key)

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Apply records read back from the changelog (or a global table's topic)."""
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        """Graph attributes."""
        return {
            "partitions": self.partitions,
            "key_type": _type_name(self.key_type),
            "value_type": _type_name(self.value_type),
            "changelog": self.changelog_topic,
        }


class Table(TableBase[K, V]):
    """A partitioned table, read and written like a dict from agents.

    ``table[key] += 1`` inside an agent updates the partition that owns ``key``; that must
    be the partition of the record being processed, or the update would live on the wrong
    worker after a rebalance (re-key the stream with ``topic.group_by`` first).

    >>> import flowkit
    >>> app = flowkit.App("shop", partitions=4)
    >>> totals = app.table("totals", default=int)
    >>> totals.changelog_topic
    'shop-totals-changelog'
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._data: dict[int, dict[K, V]] = {}
        self._dirty: dict[int, set[K]] = {}

    def tumbling(
        self,
        size: float,
        *,
        grace: float | None = None,
        expires: float | None = None,
        max_future: float = 3600.0,
        **options: Any,
    ) -> WindowedTable[K, V]:
        """This table as tumbling windows of ``size`` seconds (see ``WindowedTable``)."""
        from .windows import TumblingWindow

        spec = TumblingWindow(size, grace=grace, expires=expires, max_future=max_future)
        return self._windowed(spec, **options)

    def hopping(
        self,
        size: float,
        step: float,
        *,
        grace: float | None = None,
        expires: float | None = None,
        max_future: float = 3600.0,
        **options: Any,
    ) -> WindowedTable[K, V]:
        """This table as windows of ``size`` seconds starting every ``step`` seconds."""
        from .windows import HoppingWindow

        spec = HoppingWindow(size, step=step, grace=grace, expires=expires, max_future=max_future)
        return self._windowed(spec, **options)

    def _windowed(self, spec: WindowSpec, **options: Any) -> WindowedTable[K, V]:
        if self._replace is None:
            raise DefinitionError(f"table {self.name!r} was not declared with app.table()")
        windowed: WindowedTable[K, V] = self._replace(self, spec, options)
        return windowed

    _replace: Callable[[Table[Any, Any], WindowSpec, dict[str, Any]], Any] | None = None

    # -- dict interface -------------------------------------------------------------------

    def _write_partition(self, key: K) -> dict[K, V]:
        p = self.partition_of(key)
        source = active_source()
        if source is not None and source.batch is not None:
            tp = source.batch.tp
            if tp.partition != p:
                raise DefinitionError(
                    f"table {self.name!r}: key {key!r} belongs to partition {p}, but the "
                    f"record being processed came from {tp.topic}/{tp.partition}; re-key "
                    "the stream so that the table key is the record key "
                    "(@app.agent(topic.group_by(key_fn, name=...)))"
                )
        data = self._data.get(p)
        if data is None:
            raise NotRunningError(
                f"table {self.name!r}: partition {p} is not assigned to this worker"
            )
        dirty = self._dirty.get(p)
        if dirty is None:
            dirty = self._dirty[p] = set()
        dirty.add(key)
        return data

    def __getitem__(self, key: K) -> V:
        data = self._data.get(self.partition_of(key))
        if data is not None and key in data:
            return data[key]
        if self.default is None:
            raise KeyError(key)
        return self.default()

    def __setitem__(self, key: K, value: V) -> None:
        self._write_partition(key)[key] = value

    def __delitem__(self, key: K) -> None:
        del self._write_partition(key)[key]

    def __contains__(self, key: object) -> bool:
        data = self._data.get(self.partition_of(key))  # type: ignore[arg-type]
        return data is not None and key in data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default`` (the table's default is not used)."""
        data = self._data.get(self.partition_of(key))
        if data is None:
            return default
        return data.get(key, default)

    def __iter__(self) -> Iterator[K]:
        for data in list(self._data.values()):
            yield from list(data)

    def __len__(self) -> int:
        return sum(len(d) for d in self._data.values())

    def items(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs of the partitions this worker holds."""
        for data in list(self._data.values()):
            yield from list(data.items())

    # -- the worker's side ----------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these partitions (empty until recovered)."""
        for p in partitions:
            self._data.setdefault(p, {})

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        for p in partitions:
            self._data.pop(p, None)
            self._dirty.pop(p, None)

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self._data)

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Rebuild state from changelog records (None value = deleted)."""
        data = self._data.setdefault(partition, {})
        decode = self.value_codec.decode
        key_decode = self.key_codec.decode
        for m in messages:
            if m.key is None:
                continue
            key = key_decode(m.key)
            if m.value is None:
                data.pop(key, None)
            else:
                data[key] = decode(m.value)

    def drain_changes(self) -> list[tuple[int, bytes, bytes | None]]:
        """The latest value of every key changed since the last drain: (partition, key,
        value or None for a delete)."""
        out: list[tuple[int, bytes, bytes | None]] = []
        encode = self.value_codec.encode
        for p, keys in self._dirty.items():
            data = self._data.get(p, {})
            for key in keys:
                value = data.get(key, _MISSING)
                out.append((p, self.encode_key(key), None if value is _MISSING else encode(value)))
        self._dirty = {}
        return out


class GlobalTable(TableBase[K, V]):
    """A table every worker holds whole, fed from its topic; read-only in agents.

    Fill it by producing to its topic (``await table.put(key, value)`` in a task, or any
    Kafka producer), or give ``loader``: a function returning ``(key, value)`` pairs that
    the worker produces at start when the topic is empty. A worker reads the whole topic
    before its agents process anything, then follows updates.
    """

    kind = "global_table"

    def __init__(
        self,
        name: str,
        *,
        topic: Topic[Any],
        loader: Callable[[], Iterable[tuple[K, V]]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.topic = topic
        self.loader = loader
        self._data: dict[K, V] = {}

    @property
    def changelog_topic(self) -> str:
        """A global table's changelog is its own topic."""
        return self.topic.name

    def __getitem__(self, key: K) -> V:
        try:
            return self._data[key]
        except KeyError:
            if self.default is None:
                raise
            return self.default()

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default``."""
        return self._data.get(key, default)

    @property
    def fast_get(self) -> Callable[..., Any]:
        """``get`` without a Python frame (the dict's own), for stream joins."""
        return self._data.get

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> Iterator[tuple[K, V]]:
        """All (key, value) pairs."""
        return iter(list(self._data.items()))

    async def put(self, key: K, value: V | None) -> None:
        """Produce ``key -> value`` to the table's topic (None deletes); inside a worker."""
        await self.topic.send(value, key=key)

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Apply records from the table's topic."""
        data = self._data
        decode = self.topic.decode
        key_decode = self.topic.decode_key
        for m in messages:
            if m.key is None:
                continue
            key = key_decode(m.key)
            if m.value is None:
                data.pop(key, None)
            else:
                data[key] = decode(m.value)


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "Any"
    name = getattr(tp, "__qualname__", None)
    return name if isinstance(name, str) else repr(tp)
