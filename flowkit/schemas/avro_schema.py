"""The Avro schema of a type, and whether one Avro schema can read what another wrote.

``avro_schema`` derives a record type's schema from its fields: ``int`` is ``long``,
``float`` ``double``, ``X | None`` a union with ``null`` (first when the default is None,
as Avro's defaults require), lists are arrays, ``dict[str, X]`` maps, nested records named
records, and an ``enum.Enum`` of text values an Avro enum. What Avro cannot say (``Any``, a
dict with other keys, a ``Decimal`` without a scale) is a ``DefinitionError`` naming the field.

>>> import flowkit
>>> class Item(flowkit.Record):
...     sku: str
...     quantity: int = 1
>>> avro_schema(Item)
{'type': 'record', 'name': 'Item', 'fields': [{'name': 'sku', 'type': 'string'}, \
{'name': 'quantity', 'type': 'long', 'default': 1}]}

``read_problems(reader, writer)`` follows Avro's schema resolution: one line per field the
reader cannot take from what the writer wrote, ``field 'x': expected long, found string``.
"""

from __future__ import annotations

import datetime
import enum
import re
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
from msgspec import inspect

from ..errors import DefinitionError

__all__ = ["BUILTIN_TYPES", "avro_schema", "read_problems", "type_text"]

BUILTIN_TYPES = (bytes, bytearray, datetime.datetime, datetime.date, uuid.UUID)
"""What ``msgspec.to_builtins`` leaves as it is for Avro's writer (its logical types)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
# Avro's promotions: a reader of the key type reads what a writer of these types wrote.
_PROMOTED = {
    "long": {"int"},
    "float": {"int", "long"},
    "double": {"int", "long", "float"},
    "string": {"bytes"},
    "bytes": {"string"},
}


def avro_schema(type_: Any, *, namespace: str | None = None) -> Any:
    """The Avro schema (as JSON data) of ``type_``; records are named after their class."""
    return _Deriver(namespace).schema(inspect.type_info(type_), type_name(type_))


def type_name(type_: Any) -> str:
    return getattr(type_, "__name__", repr(type_))


class _Deriver:
    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self.named: set[str] = set()

    def schema(self, info: inspect.Type, where: str) -> Any:
        simple = _SIMPLE.get(type(info))
        if simple is not None:
            return simple
        if isinstance(info, inspect.StructType):
            return self.record(info)
        if isinstance(info, inspect.UnionType):
            return [self.schema(t, where) for t in info.types]
        if isinstance(info, inspect.ListType | inspect.SetType | inspect.FrozenSetType):
            return {"type": "array", "items": self.schema(info.item_type, f"{where}[]")}
        if isinstance(info, inspect.VarTupleType):
            return {"type": "array", "items": self.schema(info.item_type, f"{where}[]")}
        if isinstance(info, inspect.DictType) and isinstance(info.key_type, inspect.StrType):
            return {"type": "map", "values": self.schema(info.value_type, f"{where}{{}}")}
        if isinstance(info, inspect.EnumType):
            return self.enum(info.cls, where)
        raise DefinitionError(
            f"{where}: Avro has no type for {_shown(info)} (use str, int, float, bool, bytes, "
            "a record, a list, dict[str, ...], an Enum of text values or X | None)"
        )

    def record(self, info: inspect.StructType) -> Any:
        name = info.cls.__name__
        if name in self.named:
            return name  # named once, referred to by name after that (Avro's rule)
        outermost = not self.named
        self.named.add(name)
        fields = []
        for field in info.fields:
            where = f"{name}.{field.name}"
            schema = self.schema(field.type, where)
            entry: dict[str, Any] = {"name": field.encode_name, "type": schema}
            if not field.required:
                default = _default(field)
                if isinstance(schema, list):  # a union's default is of its first branch
                    schema.sort(key=lambda s: s != "null" if default is None else s == "null")
                entry["default"] = default
            fields.append(entry)
        out: dict[str, Any] = {"type": "record", "name": name}
        if self.namespace and outermost:  # nested records inherit it
            out["namespace"] = self.namespace
        out["fields"] = fields
        return out

    def enum(self, cls: type[enum.Enum], where: str) -> Any:
        name = cls.__name__
        if name in self.named:
            return name
        symbols = [m.value for m in cls]
        if not all(isinstance(s, str) and _NAME.match(s) for s in symbols):
            raise DefinitionError(
                f"{where}: an Avro enum's symbols are names ([A-Za-z_][A-Za-z0-9_]*); "
                f"{name} has values {symbols!r}"
            )
        self.named.add(name)
        return {"type": "enum", "name": name, "symbols": symbols}


_SIMPLE: dict[type, Any] = {
    inspect.NoneType: "null",
    inspect.BoolType: "boolean",
    inspect.IntType: "long",
    inspect.FloatType: "double",
    inspect.StrType: "string",
    inspect.BytesType: "bytes",
    inspect.ByteArrayType: "bytes",
    inspect.DateTimeType: {"type": "long", "logicalType": "timestamp-millis"},
    inspect.DateType: {"type": "int", "logicalType": "date"},
    inspect.UUIDType: {"type": "string", "logicalType": "uuid"},
}


def _default(field: inspect.Field) -> Any:
    value = field.default
    if value is msgspec.NODEFAULT:
        value = field.default_factory()
    return msgspec.to_builtins(value)


def _shown(info: inspect.Type) -> str:
    return type(info).__name__.removesuffix("Type") or "this type"


# -- resolution ---------------------------------------------------------------------------


def read_problems(reader: Any, writer: Any) -> list[str]:
    """Why ``reader`` cannot read all that ``writer`` may write: one line per field.

    >>> read_problems("long", "int"), read_problems("int", "string")
    ([], ['expected int, found string'])
    """
    return list(_problems(reader, writer, "", _names(reader), _names(writer)))


def type_text(schema: Any, names: dict[str, Any] | None = None) -> str:
    """A schema as the one word a problem line shows (``long``, ``Item``, ``null | string``)."""
    if isinstance(schema, list):
        return " | ".join(type_text(s) for s in schema)
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "array":
            return f"array of {type_text(schema['items'])}"
        if kind == "map":
            return f"map of {type_text(schema['values'])}"
        if kind in ("record", "enum", "fixed"):
            return f"{kind} {schema['name'].rpartition('.')[2]}"
        return str(kind)
    return str(schema)


def _names(schema: Any, found: dict[str, Any] | None = None) -> dict[str, Any]:
    found = {} if found is None else found
    if isinstance(schema, list):
        for s in schema:
            _names(s, found)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "enum", "fixed", "error"):
            found[str(schema["name"]).rpartition(".")[2]] = schema
            for field in schema.get("fields", ()):
                _names(field["type"], found)
        elif kind == "array":
            _names(schema["items"], found)
        elif kind == "map":
            _names(schema["values"], found)
        elif isinstance(kind, dict | list):
            _names(kind, found)
    return found


def _resolve(schema: Any, names: dict[str, Any]) -> Any:
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        return names.get(schema.rpartition(".")[2], schema)
    if isinstance(schema, dict) and isinstance(schema.get("type"), dict | list | str):
        kind = schema["type"]
        if isinstance(kind, dict | list) or (kind in _PRIMITIVES and len(schema) > 1):
            return _resolve(kind, names)  # {"type": "long", "logicalType": ...} reads as long
        if kind not in _PRIMITIVES and kind not in ("record", "enum", "fixed", "array", "map"):
            return names.get(kind.rpartition(".")[2], kind)
        if kind in _PRIMITIVES:
            return kind
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return "record" if schema["type"] == "error" else str(schema["type"])
    return str(schema)


def _problems(
    reader: Any, writer: Any, path: str, rnames: dict[str, Any], wnames: dict[str, Any]
) -> Iterator[str]:
    reader, writer = _resolve(reader, rnames), _resolve(writer, wnames)
    at = f"field {path!r}: " if path else ""
    if isinstance(writer, list):  # every branch the writer may have taken must be readable
        for branch in writer:
            yield from _problems(reader, branch, path, rnames, wnames)
        return
    if isinstance(reader, list):  # the first branch that reads the writer's type
        for branch in reader:
            if not list(_problems(branch, writer, path, rnames, wnames)):
                return
        yield f"{at}expected {type_text(reader)}, found {type_text(writer)}"
        return
    rkind, wkind = _kind(reader), _kind(writer)
    if rkind != wkind:
        if wkind not in _PROMOTED.get(rkind, ()):
            yield f"{at}expected {type_text(reader)}, found {type_text(writer)}"
        return
    if rkind == "array":
        yield from _problems(reader["items"], writer["items"], f"{path}[]", rnames, wnames)
    elif rkind == "map":
        yield from _problems(reader["values"], writer["values"], f"{path}{{}}", rnames, wnames)
    elif rkind in ("record", "enum", "fixed"):
        rname, wname = (str(s["name"]).rpartition(".")[2] for s in (reader, writer))
        if rname != wname and wname not in reader.get("aliases", ()):
            yield f"{at}expected {type_text(reader)}, found {type_text(writer)}"
        elif rkind == "fixed" and reader["size"] != writer["size"]:
            yield f"{at}expected {reader['size']} bytes, found {writer['size']}"
        elif rkind == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                yield f"{at}expected one of {reader['symbols']}, found symbol {missing[0]!r}"
        elif rkind == "record":
            written = {f["name"]: f for f in writer["fields"]}
            for field in reader["fields"]:
                inner = f"{path}.{field['name']}" if path else field["name"]
                source = written.get(field["name"])
                if source is None:
                    for alias in field.get("aliases", ()):
                        source = written.get(alias)
                if source is not None:
                    yield from _problems(field["type"], source["type"], inner, rnames, wnames)
                elif "default" not in field:
                    yield (
                        f"field {inner!r}: expected {type_text(field['type'])} with a default "
                        "(the writer's schema has no such field), found no default"
                    )
