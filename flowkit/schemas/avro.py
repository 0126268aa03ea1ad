"""Avro through a Schema Registry: ``codec=flowkit.Avro(registry)``.

The record type's Avro schema is derived from its fields (``avro_schema``); fastavro reads
and writes the payload, resolving a writer's schema against the type's own where the two
differ (a field added with a default, a field the type does not declare, ``int`` read as
``long``), and msgspec turns the result into the record type, validating it.
"""

from __future__ import annotations

import io
from typing import Any, TypeVar

import msgspec

from ..errors import ConfigurationError
from .avro_schema import BUILTIN_TYPES, avro_schema, read_problems
from .codec import Reader, SchemaCodec, SchemaFormat
from .registry import SchemaRegistry
from .wire import HEADER_SIZE

__all__ = ["Avro", "AvroCodec"]

T = TypeVar("T")


def _fastavro() -> Any:
    try:
        import fastavro
    except ImportError:
        raise ConfigurationError(
            "Avro needs the extra flowkit[registry] (pip install 'flowkit[registry]')"
        ) from None
    return fastavro


class AvroCodec(SchemaCodec[T]):
    """Avro values of ``type`` under ``subject`` (see ``SchemaCodec``)."""

    name = "avro"
    schema_type = "AVRO"

    def __init__(
        self,
        type: Any,
        registry: SchemaRegistry,
        subject: str,
        *,
        namespace: str | None = None,
    ) -> None:
        super().__init__(type, registry, subject)
        self._fastavro = _fastavro()
        self.schema = avro_schema(type, namespace=namespace)
        self._parsed = self._fastavro.parse_schema(self.schema)
        self._convert = msgspec.convert

    def payload(self, value: T) -> bytes:
        out = io.BytesIO()
        data = msgspec.to_builtins(value, builtin_types=BUILTIN_TYPES)
        self._fastavro.schemaless_writer(out, self._parsed, data)
        return out.getvalue()

    def reader(self, writer: Any) -> Reader:
        fastavro, type_, convert = self._fastavro, self.type, self._convert
        read, ours = fastavro.schemaless_reader, self._parsed
        written = ours if writer == self.schema else fastavro.parse_schema(writer)
        resolved = None if written is ours else ours

        def decode(data: bytes) -> Any:
            source = io.BytesIO(data)  # shares the bytes: no copy
            source.seek(HEADER_SIZE)
            return convert(read(source, written, resolved), type_)

        return decode

    def problems(self, reader: Any, writer: Any) -> list[str]:
        return read_problems(reader, writer)


class Avro(SchemaFormat):
    """Avro in Confluent's wire format, its schema in ``registry``, derived from the topic's
    value type (``namespace`` names its records' namespace).

    >>> import flowkit
    >>> class Order(flowkit.Record):
    ...     id: int
    ...     amount_cents: int = 0
    >>> registry = flowkit.SchemaRegistry("mock://doc-avro")
    >>> app = flowkit.App("shop")
    >>> orders = app.topic("orders", value_type=Order, codec=flowkit.Avro(registry))
    >>> data = orders.encode(Order(7, 250))  # registers Order under "orders-value"
    >>> data[:5], orders.decode(data)
    (b'\\x00\\x00\\x00\\x00\\x01', Order(id=7, amount_cents=250))
    """

    codec_class = AvroCodec

    def __init__(
        self, registry: SchemaRegistry | str | None = None, *, namespace: str | None = None
    ) -> None:
        super().__init__(registry, namespace=namespace)
