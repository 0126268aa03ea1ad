"""Schema Registry formats: Avro and JSON Schema in Confluent's wire format.

A topic whose records other services read or write through a Schema Registry declares its
format with the registry::

    registry = flowkit.SchemaRegistry("https://registry:8081")
    orders = app.topic("orders", value_type=Order, codec=flowkit.Avro(registry))

The schema comes from the type; a worker checks at start that it is compatible with what the
registry holds for the topic's subject, under the subject's compatibility rule, and
``flowkit graph --check`` does the same. The client library (``flowkit[registry]``) is
imported only when a registry is first used: ``import flowkit`` does not import it.
"""

from __future__ import annotations

from .avro import Avro, AvroCodec
from .codec import SchemaCodec, SchemaFormat
from .json_schema import JsonSchema, JsonSchemaCodec
from .registry import SchemaRegistry

__all__ = [
    "Avro",
    "AvroCodec",
    "JsonSchema",
    "JsonSchemaCodec",
    "SchemaCodec",
    "SchemaFormat",
    "SchemaRegistry",
]
