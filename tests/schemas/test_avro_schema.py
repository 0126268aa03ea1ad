"""The Avro schema derived from a record type, and the resolution check against Avro's own.

Apache Avro's Python library (a dependency of the registry extra) carries a port of Java's
``SchemaCompatibility``: it parses every derived schema (strictly: a union's default must
be of its first branch) and is the oracle the resolution check is compared with.
"""

from __future__ import annotations

import datetime
import enum
import json
import os
from typing import Any

import avro.compatibility
import avro.schema
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.schemas.avro_schema import avro_schema, read_problems


class Colour(enum.Enum):
    RED = "RED"
    GREEN = "GREEN"


class Item(flowkit.Record):
    sku: str
    quantity: int = 1


class Order(flowkit.Record):
    id: int
    items: list[Item]
    note: str | None = None
    colour: Colour = Colour.RED
    tags: dict[str, float] = msgspec.field(default_factory=dict)
    main: Item | None = None
    at: datetime.datetime | None = None
    raw: bytes = b""
    ok: bool = True


def parse(schema: Any) -> avro.schema.Schema:
    return avro.schema.parse(json.dumps(schema))


def test_a_record_type_becomes_a_named_avro_record() -> None:
    schema = avro_schema(Order, namespace="com.shop")
    parse(schema)  # Avro's own parser takes it
    fields = {f["name"]: f for f in schema["fields"]}
    assert schema["name"] == "Order" and schema["namespace"] == "com.shop"
    assert fields["id"] == {"name": "id", "type": "long"}
    assert fields["items"]["type"]["items"]["name"] == "Item"
    assert fields["note"] == {"name": "note", "type": ["null", "string"], "default": None}
    assert fields["colour"]["type"] == {
        "type": "enum",
        "name": "Colour",
        "symbols": ["RED", "GREEN"],
    }
    assert fields["colour"]["default"] == "RED"
    assert fields["tags"] == {
        "name": "tags",
        "type": {"type": "map", "values": "double"},
        "default": {},
    }
    assert fields["main"]["type"] == ["null", "Item"]  # named once, then by name


def test_a_union_default_is_of_its_first_branch() -> None:
    class Flag(flowkit.Record):
        level: int | None = 3

    schema = avro_schema(Flag)
    assert schema["fields"][0] == {"name": "level", "type": ["long", "null"], "default": 3}
    parse(schema)


@pytest.mark.parametrize(
    ("annotation", "said"),
    [
        (Any, "Flawed.field"),
        (dict[int, str], "Flawed.field"),
        (enum.Enum("E", {"a": 1}), "symbols"),
    ],
    ids=["any", "int-keys", "int-enum"],
)
def test_what_avro_cannot_say_names_the_field(annotation: Any, said: str) -> None:
    flawed = msgspec.defstruct("Flawed", [("field", annotation)], bases=(flowkit.Record,))
    with pytest.raises(flowkit.DefinitionError, match=said):
        avro_schema(flawed)


# -- schema evolution: the resolution check against Avro's own ------------------------------

FIELD_TYPES = ["int", "long", "float", "double", "string", "bytes", "boolean", ["null", "string"]]


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from("abcdef"), unique=True, max_size=5))
    fields = []
    for name in names:
        kind = draw(st.sampled_from(FIELD_TYPES))
        field: dict[str, Any] = {"name": name, "type": kind}
        if draw(st.booleans()):
            field["default"] = {
                "int": 0,
                "long": 0,
                "float": 0.5,
                "double": 0.5,
                "string": "s",
                "bytes": "",
                "boolean": False,
            }.get(kind if isinstance(kind, str) else "")
        fields.append(field)
    return {"type": "record", "name": "R", "fields": fields}


# Sized for CI; FLOWKIT_SCHEMA_EXAMPLES=2000 for a long run.
@settings(max_examples=int(os.environ.get("FLOWKIT_SCHEMA_EXAMPLES", "60")), deadline=None)
@given(reader=records(), writer=records())
def test_read_problems_agree_with_avros_own_check(
    reader: dict[str, Any], writer: dict[str, Any]
) -> None:
    verdict = avro.compatibility.ReaderWriterCompatibilityChecker().get_compatibility(
        parse(reader), parse(writer)
    )
    compatible = verdict.compatibility is avro.compatibility.SchemaCompatibilityType.compatible
    assert (read_problems(reader, writer) == []) == compatible, verdict.messages


def test_evolution_lines_name_field_expected_and_found() -> None:
    class V1(flowkit.Record):
        id: int
        amount: int

    class V2(flowkit.Record):  # a field added with a default: reads V1's records
        id: int
        amount: int
        currency: str = "EUR"

    class V3(flowkit.Record):  # a field added without one: cannot
        id: int
        amount: int
        currency: str

    class V4(flowkit.Record):  # a type changed
        id: int
        amount: str

    v1, v2, v3, v4 = (avro_schema(t) for t in (V1, V2, V3, V4))
    for schema in (v1, v2, v3, v4):
        schema["name"] = "Order"
    assert read_problems(v2, v1) == []
    assert read_problems(v1, v2) == []  # a field removed: the old reader skips it
    assert read_problems(v3, v1) == [
        "field 'currency': expected string with a default (the writer's schema has no such "
        "field), found no default"
    ]
    assert read_problems(v4, v1) == ["field 'amount': expected string, found long"]
    assert read_problems(v1, v4) == ["field 'amount': expected long, found string"]
