"""What every table declaration shares: name, codecs, partitioning, a changelog topic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .. import arguments
from ..codecs import Codec, codec_for
from ..errors import DefinitionError
from ..partitioning import partition_for_key
from ..scope import current_scope, require_scope

__all__ = ["TableBase"]

# Keys whose partition is remembered, per table: murmur2 in Python costs about 3 us a key
# and streams repeat keys, but a cache of every key would cost a table ~100 B a key more.
_KEY_CACHE = 100_000

K = TypeVar("K")
V = TypeVar("V")


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
        arguments.count(partitions, f"table {name!r}: partitions")
        if default is not None and not callable(default):
            raise DefinitionError(f"table {name!r}: default must be callable, like int or list")
        self.name = name
        self.app_name = app_name
        self.partitions = partitions
        self.default = default
        self.key_type = key_type
        self.value_type = value_type
        self.key_codec: Codec[Any] = codec_for(
            key_type, key_codec, what=f"table {name!r}: key_type"
        )
        self.value_codec: Codec[Any] = codec_for(
            value_type, value_codec or "json", what=f"table {name!r}: value_type"
        )
        self._key_partition: dict[Any, int] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} partitions={self.partitions}>"

    @property
    def changelog_topic(self) -> str:
        """The compacted topic that holds this table's latest values."""
        return f"{self.app_name}-{self.name}-changelog"

    def partition_of(self, key: K) -> int:
        """The partition that owns ``key`` (Kafka's murmur2 of the encoded key)."""
        cache = self._key_partition
        p = cache.get(key)
        if p is None:
            if len(cache) >= _KEY_CACHE:  # bounded: a table of millions of keys
                cache.clear()
            raw = key if isinstance(key, bytes) else self.key_codec.encode(key)
            p = cache[key] = partition_for_key(raw, self.partitions)
        return p

    def encode_key(self, key: K) -> bytes:
        """The changelog key bytes."""
        return key if isinstance(key, bytes) else self.key_codec.encode(key)

    def new_store(self, now_ms: Callable[[], int]) -> Any:
        """A fresh, empty store for one worker (``now_ms`` is that worker's wall clock)."""
        raise NotImplementedError

    def store(self) -> Any:
        """The store of the worker running the calling task."""
        scope = current_scope()
        if scope is None:  # the message is built only here: a read in an agent is per record
            scope = require_scope(f"table {self.name!r}")
        return scope.stores[self]

    def describe(self) -> dict[str, object]:
        """Graph attributes."""
        return {
            "partitions": self.partitions,
            "key_type": _type_name(self.key_type),
            "value_type": _type_name(self.value_type),
            "changelog": self.changelog_topic,
        }


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "Any"
    name = getattr(tp, "__qualname__", None)
    return name if isinstance(name, str) else repr(tp)
