"""JSON Schema through a Schema Registry: ``codec=flowkit.JsonSchema(registry)``.

The payload after the header is plain JSON, so msgspec decodes it straight into the record
type, validating it as it goes: the type is the schema, and no intermediate dict is made.
The JSON Schema registered is msgspec's own for the type (``msgspec.json.schema``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import msgspec

from .codec import Reader, SchemaCodec, SchemaFormat
from .registry import SchemaRegistry
from .wire import HEADER_SIZE

__all__ = ["JsonSchema", "JsonSchemaCodec", "json_problems"]

T = TypeVar("T")


class JsonSchemaCodec(SchemaCodec[T]):
    """JSON values of ``type`` under ``subject`` (see ``SchemaCodec``)."""

    name = "json-schema"
    schema_type = "JSON"

    def __init__(self, type: Any, registry: SchemaRegistry, subject: str) -> None:
        super().__init__(type, registry, subject)
        self.schema = msgspec.json.schema(type)
        self._json_encoder = msgspec.json.Encoder()
        self._json = msgspec.json.Decoder(type)

    def payload(self, value: T) -> bytes:
        return self._json_encoder.encode(value)

    def reader(self, writer: Any) -> Reader:
        decode = self._json.decode

        def read(data: bytes) -> Any:
            return decode(memoryview(data)[HEADER_SIZE:])

        return read

    def problems(self, reader: Any, writer: Any) -> list[str]:
        return json_problems(reader, writer)


class JsonSchema(SchemaFormat):
    """JSON in Confluent's wire format, its JSON Schema in ``registry``, derived from the
    topic's value type.

    >>> import flowkit
    >>> class Order(flowkit.Record):
    ...     id: int
    >>> app = flowkit.App("shop")
    >>> orders = app.topic(
    ...     "orders", value_type=Order, codec=flowkit.JsonSchema("mock://doc-json"))
    >>> orders.encode(Order(7))
    b'\\x00\\x00\\x00\\x00\\x01{"id":7}'
    """

    codec_class = JsonSchemaCodec

    def __init__(self, registry: SchemaRegistry | str | None = None) -> None:
        super().__init__(registry)


# -- compatibility, field by field ----------------------------------------------------------

_WIDER = {"number": {"integer"}}


def json_problems(reader: Any, writer: Any) -> list[str]:
    """Why a reader of JSON Schema ``reader`` may fail on what ``writer`` allows: a property
    the reader requires that the writer may leave out, or a property whose types differ
    (an ``integer`` read as a ``number`` is fine). Objects are compared property by property,
    through local ``$ref``s; other keywords (patterns, bounds) are not compared.

    >>> json_problems({"type": "number"}, {"type": "integer"})
    []
    >>> json_problems({"type": "object", "properties": {"a": {"type": "string"}},
    ...                "required": ["a"]}, {"type": "object", "properties": {}})
    ["field 'a': expected required string, found missing"]
    """
    return list(_json(reader, writer, "", reader, writer, 0))


def _deref(schema: Any, root: Any) -> Any:
    for _ in range(32):  # a $ref to a $ref: bounded, so a cycle cannot hang the check
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        schema = target
    return schema


def _types(schema: Any, root: Any) -> set[str]:
    schema = _deref(schema, root)
    if not isinstance(schema, dict):
        return set()
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return {kinds}
    if isinstance(kinds, list):
        return {k for k in kinds if isinstance(k, str)}
    found: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, ()):
            branch_types = _types(branch, root)
            if not branch_types:
                return set()  # a branch of any type: anything goes
            found |= branch_types
    if "enum" in schema and not found:
        return {_JSON_TYPES.get(type(v), "object") for v in schema["enum"]}
    return found


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_JSON_TYPES[type(None)] = "null"


def _json(reader: Any, writer: Any, path: str, rroot: Any, wroot: Any, depth: int) -> Iterator[str]:
    if depth > 32:
        return
    reader, writer = _deref(reader, rroot), _deref(writer, wroot)
    rtypes, wtypes = _types(reader, rroot), _types(writer, wroot)
    at = f"field {path!r}: " if path else ""
    if rtypes and wtypes:
        extra = {w for w in wtypes - rtypes if not any(w in _WIDER.get(r, ()) for r in rtypes)}
        if extra:
            yield f"{at}expected {' | '.join(sorted(rtypes))}, found {' | '.join(sorted(wtypes))}"
            return
    if not (isinstance(reader, dict) and isinstance(writer, dict)):
        return
    robj, wobj = _object(reader, rroot), _object(writer, wroot)
    if robj is not None and wobj is not None:
        wprops, wrequired = wobj.get("properties", {}), set(wobj.get("required", ()))
        rrequired = set(robj.get("required", ()))
        for name, rprop in robj.get("properties", {}).items():
            inner = f"{path}.{name}" if path else name
            wprop = wprops.get(name)
            if name in rrequired and name not in wrequired:
                rtext = " | ".join(sorted(_types(rprop, rroot))) or "any"
                yield f"field {inner!r}: expected required {rtext}, found " + (
                    "optional" if wprop is not None else "missing"
                )
                continue
            if wprop is not None:
                yield from _json(rprop, wprop, inner, rroot, wroot, depth + 1)
    if "items" in reader and "items" in writer:
        yield from _json(reader["items"], writer["items"], f"{path}[]", rroot, wroot, depth + 1)


def _object(schema: dict[str, Any], root: Any) -> dict[str, Any] | None:
    if "properties" in schema or schema.get("type") == "object":
        return schema
    for branch in schema.get("anyOf", ()):  # X | None
        branch = _deref(branch, root)
        if isinstance(branch, dict) and ("properties" in branch or branch.get("type") == "object"):
            return branch
    return None
