"""What the Avro and JSON Schema codecs share: the wire format, the subject, the writer's id,
a reader per schema id, and the compatibility check.

A format (``flowkit.Avro(registry)``) is given to ``app.topic(..., codec=...)``; the topic
binds it to its name and value type, which makes a ``SchemaCodec`` for the subject
``<topic>-value`` (``<topic>-key`` for a key codec): Confluent's default naming, the one
its serialisers in every language use.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from ..codecs import Codec, JsonCodec, decode_error_message
from ..errors import DecodeError
from .registry import RegisteredSchema, SchemaRegistry
from .wire import HEADER_SIZE, frame, schema_id

__all__ = ["SchemaCodec", "SchemaFormat", "compatibility_problems"]

T = TypeVar("T")

Reader = Callable[[bytes], Any]


class SchemaFormat:
    """A registry format not yet bound to a topic: ``app.topic`` binds it."""

    codec_class: ClassVar[type[SchemaCodec[Any]]]

    def __init__(self, registry: SchemaRegistry | str | None = None, **options: Any) -> None:
        if not isinstance(registry, SchemaRegistry):
            registry = SchemaRegistry(registry)
        self.registry = registry
        self.options = options

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry!r})"

    def for_topic(self, topic: str, type_: Any, *, key: bool = False) -> SchemaCodec[Any]:
        """The codec of ``topic``'s values (or keys) of ``type_``."""
        subject = f"{topic}-{'key' if key else 'value'}"
        return self.codec_class(type_, self.registry, subject, **self.options)


class SchemaCodec(Generic[T]):
    """Values of ``type`` in the wire format, under ``subject`` of ``registry``.

    Encoding registers the type's schema under the subject at first use (or finds its id)
    and frames every record with that id. Decoding reads the id, fetches that schema once,
    checks once that the type can read it, and decodes into the type; a record whose id the
    registry does not know, whose schema the type cannot read, or that is not framed at all
    is a ``DecodeError`` (dead-lettered at stage ``decode``).
    """

    name: ClassVar[str]
    schema_type: ClassVar[str]

    def __init__(self, type: Any, registry: SchemaRegistry, subject: str) -> None:
        self.type = type
        self.registry = registry
        self.subject = subject
        self.schema: Any = None  # set by the subclass: the type's schema, as JSON data
        self._header: bytes | None = None  # the writer's: made once its id is known
        self._readers: dict[bytes, Reader] = {}  # by header: magic byte and schema id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.subject!r} {self.registry!r}>"

    @property
    def internal_codec(self) -> Codec[T]:
        """The codec of the app's own internal topics for these values (a ``group_by``
        hop): JSON of the type, nothing registered under another subject."""
        return JsonCodec(self.type)

    @property
    def text(self) -> str:
        """The type's schema as registered."""
        return json.dumps(self.schema, separators=(",", ":"))

    # -- to implement ---------------------------------------------------------------------

    def payload(self, value: T) -> bytes:
        """The bytes after the wire format's header."""
        raise NotImplementedError

    def reader(self, writer: Any) -> Reader:
        """A function from a framed record written with ``writer`` to a value."""
        raise NotImplementedError

    def problems(self, reader: Any, writer: Any) -> list[str]:
        """Why ``reader`` cannot read what ``writer`` wrote (both schemas as JSON data)."""
        raise NotImplementedError

    # -- the codec ------------------------------------------------------------------------

    def encode(self, value: T, /) -> bytes:
        header = self._header
        if header is None:
            writer_id = self.registry.register(self.subject, self.schema_type, self.text)
            header = self._header = frame(writer_id, b"")
        return header + self.payload(value)

    def decode(self, data: bytes, /) -> T:
        # One slice and one dict lookup per record: the readers are keyed by the whole
        # header, magic byte included, so a record that is not framed never finds one.
        read = self._readers.get(data[:HEADER_SIZE])
        if read is None:
            writer_id = schema_id(data)  # raises for a record that is not framed
            read = self._readers[data[:HEADER_SIZE]] = self._reader_for(writer_id)
        try:
            value: T = read(data)
        except DecodeError:
            raise
        except Exception as exc:  # the payload does not match its schema: truncated, ...
            said = decode_error_message(exc) if str(exc) else f"{type(exc).__name__} (truncated?)"
            writer_id = int.from_bytes(data[1:HEADER_SIZE], "big")
            raise DecodeError(f"schema id {writer_id}: {said}") from None
        return value

    def _reader_for(self, writer_id: int) -> Reader:
        found = self.registry.schema(writer_id)
        if found is None:
            return _failing(f"unknown schema id {writer_id}: the registry has no such schema")
        if found.schema_type != self.schema_type:
            return _failing(f"schema id {writer_id} is {found.schema_type}, not {self.schema_type}")
        writer = json.loads(found.text)
        problems = self.problems(self.schema, writer)
        if problems:
            return _failing(
                f"schema id {writer_id} cannot be read as {_type_name(self.type)}: {problems[0]}"
            )
        return self.reader(writer)

    # -- the check at start -----------------------------------------------------------------

    def verify(self) -> list[str]:
        """Problems between the type and the subject's registered versions under the
        subject's compatibility rule, one line each; none when the subject does not exist."""
        versions = self.registry.versions(self.subject)
        if not versions:
            return []
        level = self.registry.compatibility(self.subject)
        return compatibility_problems(
            level,
            _type_name(self.type),
            self.schema_type,
            self.schema,
            versions,
            self.subject,
            self.problems,
        )


def compatibility_problems(
    level: str,
    name: str,
    schema_type: str,
    ours: Any,
    versions: list[RegisteredSchema],
    subject: str,
    problems: Callable[[Any, Any], list[str]],
) -> list[str]:
    """The problems of registering ``ours`` as a new version under ``level``.

    ``BACKWARD``: ``ours`` reads what the latest version wrote; ``FORWARD``: the latest
    version reads what ``ours`` writes; ``FULL``: both; ``*_TRANSITIVE``: against every
    version, not only the latest; ``NONE``: nothing is checked. A version of another schema
    type than ``schema_type`` (Protobuf in an Avro subject) is a problem of its own.
    """
    level = level.upper()
    base = level.removesuffix("_TRANSITIVE")
    if base not in ("BACKWARD", "FORWARD", "FULL"):
        return []
    found: list[str] = []
    for version in versions if level.endswith("_TRANSITIVE") else versions[-1:]:
        where = f"version {version.version} of subject {subject!r} ({level})"
        if version.schema_type != schema_type:
            found.append(f"{where} is {version.schema_type}, not {schema_type}")
            continue
        theirs = json.loads(version.text)
        if base in ("BACKWARD", "FULL"):
            found.extend(f"{name} cannot read {where}: {p}" for p in problems(ours, theirs))
        if base in ("FORWARD", "FULL"):
            found.extend(f"{where} cannot read {name}: {p}" for p in problems(theirs, ours))
    return found


def _failing(message: str) -> Reader:
    def read(data: bytes) -> Any:
        raise DecodeError(message)

    return read


def _type_name(type_: Any) -> str:
    return getattr(type_, "__name__", repr(type_))
