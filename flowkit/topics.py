"""Topics: named, partitioned, typed logs that agents read and write.

A ``Topic[T]`` is a declaration: its name, partitions, key and value types, and the codecs
built once from them. It does no I/O and holds no runtime state: ``await topic.send(...)``
goes through the producer of the worker running the calling task.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import msgspec

from . import arguments
from .codecs import Codec, CodecFormat, codec_for, decode_error_message
from .errors import DecodeError, DefinitionError, NotRunningError
from .records import Event, Headers, Message
from .scope import require_scope

__all__ = ["Repartition", "Topic"]

T = TypeVar("T")


class Topic(Generic[T]):
    """A typed topic. Declare it with ``app.topic(...)``.

    >>> import flowkit
    >>> app = flowkit.App("shop")
    >>> orders = app.topic("orders", value_type=int, partitions=4)
    >>> orders.decode(orders.encode(42))
    42
    """

    def __init__(
        self,
        name: str,
        *,
        value_type: Any = Any,
        key_type: Any = str,
        partitions: int = 1,
        codec: str | Codec[Any] | CodecFormat | None = None,
        key_codec: str | Codec[Any] | CodecFormat | None = None,
        internal: bool = False,
        compacted: bool = False,
        external: bool = False,
    ) -> None:
        self.name = name
        self.external = external  # another service reads or writes it: see Graph.warnings
        self.value_type = value_type
        self.key_type = key_type
        self.partitions = partitions
        self.internal = internal
        self.compacted = compacted
        self.value_codec: Codec[Any] = codec_for(
            value_type, codec, what=f"topic {name!r}: value_type", topic=name
        )
        self.key_codec: Codec[Any] = codec_for(
            key_type, key_codec, what=f"topic {name!r}: key_type", topic=name, key=True
        )
        self.app_name: str | None = None  # the app that declared it (app.topic)
        # Fast path: a JSON/msgpack codec exposes msgspec's own decode, so a batch decodes
        # with one C call per record and no Python frame in between.
        raw = getattr(self.value_codec, "_decoder", None)
        self._fast_decode = raw.decode if raw is not None else None

    def __repr__(self) -> str:
        return f"<Topic {self.name!r} partitions={self.partitions}>"

    def check_value(self, value: Any) -> None:
        """Raise ``TypeError`` unless ``value`` is of this topic's type: an instance, an
        int for a float, or a record with every field of the topic's record type (a wider
        record that its readers decode). None (a tombstone) and untyped topics pass."""
        if value is not None and not accepts(self.value_type, value.__class__):
            raise TypeError(
                f"topic {self.name!r} takes {self.value_type_name}, not {_type_name(type(value))}"
            )

    @property
    def value_type_name(self) -> str:
        """The value type as text, for the graph."""
        return _type_name(self.value_type)

    @property
    def key_type_name(self) -> str:
        """The key type as text, for the graph."""
        return _type_name(self.key_type)

    # -- codecs ---------------------------------------------------------------------------

    def encode(self, value: T) -> bytes:
        """The bytes ``value`` is sent as."""
        return self.value_codec.encode(value)

    def decode(self, data: bytes) -> T:
        """Decode one value; raises ``DecodeError`` (whatever the codec raised)."""
        try:
            value: T = self.value_codec.decode(data)
        except Exception as exc:
            raise self.decode_error(exc) from None
        return value

    def encode_key(self, key: Any) -> bytes | None:
        """The bytes ``key`` is sent as (None stays None; bytes pass unchanged)."""
        if key is None or isinstance(key, bytes):
            return key
        return self.key_codec.encode(key)

    def decode_key(self, data: bytes | None) -> Any:
        """Decode a key; a key that does not decode is returned as its bytes."""
        if data is None:
            return None
        try:
            return self.key_codec.decode(data)
        except Exception:  # whatever the codec raises (RecursionError, ...): no decode
            return data

    def decoder(self) -> Callable[[bytes | None], T]:
        """The fastest function decoding one value: msgspec's own when the codec has one.

        It may raise msgspec's errors (or TypeError for a missing value); callers turn
        them into ``DecodeError`` with ``decode_error``.
        """
        if self._fast_decode is not None:
            return self._fast_decode  # type: ignore[no-any-return]
        return self.decode  # type: ignore[return-value]

    @staticmethod
    def decode_error(exc: BaseException) -> DecodeError:
        """``exc``, raised by a decoder, as a ``DecodeError``."""
        if isinstance(exc, DecodeError):
            return exc
        if isinstance(exc, TypeError):
            return DecodeError("tombstone: the record has no value")
        return DecodeError(decode_error_message(exc))

    def event(self, message: Message, value: T) -> Event[T]:
        """The envelope of ``message`` with its decoded ``value``."""
        return Event(
            value=value,
            key=self.decode_key(message.key),
            headers=message.headers,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            timestamp=message.timestamp,
        )

    def group_by(
        self, key: Callable[[T], Any], *, name: str, partitions: int | None = None
    ) -> Repartition[T]:
        """This topic re-keyed by ``key``, through the internal topic
        ``<app>-<name>-repartition``: read it with ``@app.agent(topic.group_by(...))``
        so a table keyed by ``key(value)`` is updated on the partition that owns the key.

        One hop per record; for counts and sums over windows a windowed table's ``add``
        avoids it (see ``flowkit.windowed``).
        """
        if self.app_name is None:
            raise DefinitionError(f"topic {self.name!r} was not declared with app.topic()")
        what = f"topic {self.name!r}: group_by()"
        arguments.function(key, f"{what}: key")
        arguments.name(name, f"{what}: name")
        partitions = arguments.optional_count(partitions, f"{what}: partitions")
        return Repartition(self, key, name=name, partitions=partitions or self.partitions)

    # -- sending --------------------------------------------------------------------------

    async def send(
        self,
        value: T,
        *,
        key: Any = None,
        headers: Headers | list[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Any]:
        """Send ``value`` to this topic from inside a running worker.

        Returns once the record is queued; await the result for the broker's ack.
        It goes through the producer of the worker running the calling task; outside a
        worker it raises ``NotRunningError`` (use ``flowkit.testing`` in tests).
        """
        self.check_value(value)
        scope = require_scope(f"topic {self.name!r}: send()")
        sender = scope.sender
        if sender is None:
            raise NotRunningError(f"topic {self.name!r}: this worker has no producer yet")
        return await sender.send_bytes(
            self.name,
            None if value is None else self.encode(value),
            key=self.encode_key(key),
            headers=tuple(headers),
            partition=partition,
            timestamp_ms=timestamp_ms,
            origin=scope.origin(),  # a refusal fails the record being processed
        )


class Repartition(Topic[T]):
    """The internal topic behind ``topic.group_by``: the source's values, re-keyed."""

    def __init__(
        self, source: Topic[T], key_fn: Callable[[T], Any], *, name: str, partitions: int
    ) -> None:
        super().__init__(
            f"{source.app_name}-{name}-repartition",
            value_type=source.value_type,
            key_type=Any,
            partitions=partitions,
            # A registry format's subject belongs to the source topic: the hop, the app's
            # own, takes the codec the format names for it (plain JSON of the type).
            codec=getattr(source.value_codec, "internal_codec", source.value_codec),
            key_codec="json",
            internal=True,
        )
        self.app_name = source.app_name
        self.source = source
        self.key_fn = key_fn
        self.group_name = name

    def encode_key(self, key: Any) -> bytes | None:
        """Keys are JSON, except text keys, which stay plain UTF-8 like Kafka's."""
        if isinstance(key, str):
            return key.encode()
        return super().encode_key(key)

    def decode_key(self, data: bytes | None) -> Any:
        value = super().decode_key(data)
        if isinstance(value, bytes):
            try:
                return value.decode()
            except UnicodeDecodeError:
                return value
        return value


@functools.lru_cache(maxsize=1024)
def accepts(expected: Any, given: Any) -> bool:
    """True when a value of type ``given`` may be sent to a topic of type ``expected``."""
    if expected is Any or expected is object or not isinstance(expected, type):
        return True  # untyped, or a type expression (a union, a generic) not checked here
    if issubclass(given, expected) or (expected is float and given is int):
        return True
    if issubclass(expected, msgspec.Struct) and issubclass(given, msgspec.Struct):
        want = {f.encode_name for f in msgspec.structs.fields(expected)}
        return want <= {f.encode_name for f in msgspec.structs.fields(given)}
    return False


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "Any"
    name = getattr(tp, "__qualname__", None)
    return name if isinstance(name, str) else repr(tp)
