"""Avro and JSON Schema through the registry client's own in-process registry (``mock://``).

Interoperability both ways with confluent-kafka's own serialisers, the undecodable records
dead-lettered at stage ``decode``, and the compatibility check at worker start.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.testing import TestDriver
from tests.conftest import DriverFactory


class Order(flowkit.Record):
    id: int
    customer: str
    amount_cents: int = 0
    note: str | None = None


class Total(flowkit.Record):
    customer: str
    amount_cents: int


# The order a Java service writes: its own namespace, an int where flowkit has a long, one
# field flowkit does not declare, and no note.
JAVA_ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "com.shop.events",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "customer", "type": "string"},
            {"name": "amount_cents", "type": "long"},
            {"name": "channel", "type": "string"},
        ],
    }
)


def make_app(fmt: type[flowkit.Avro] | type[flowkit.JsonSchema], registry: Any) -> Any:
    app = flowkit.App("shop")
    orders = app.topic("orders", value_type=Order, codec=fmt(registry))
    totals = app.topic("totals", value_type=Total, codec=fmt(registry))

    @app.agent(orders, sink=[totals], per_record=True)
    def total(order: Order) -> Total:
        return Total(order.customer, order.amount_cents)

    return app, orders, totals


def ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


async def test_avro_written_by_confluents_serializer_is_read_and_read_back_by_it(
    make_driver: DriverFactory,
) -> None:
    registry = flowkit.SchemaRegistry("mock://interop-avro")
    app, orders, totals = make_app(flowkit.Avro, registry)
    java = AvroSerializer(registry.client, JAVA_ORDER)
    written = java(
        {"id": 7, "customer": "ann", "amount_cents": 250, "channel": "web"}, ctx("orders")
    )
    reader = AvroDeserializer(registry.client)
    async with make_driver(app) as driver:
        await driver.send_raw(orders, written)
        await driver.send(orders, Order(8, "bob", 100))  # flowkit's own writer
        await driver.run_until_idle()
        [first, second] = await driver.messages(totals)
        assert not await driver.dead_letters()
    assert reader(first.value, ctx("totals")) == {"customer": "ann", "amount_cents": 250}
    assert reader(second.value, ctx("totals")) == {"customer": "bob", "amount_cents": 100}
    registered = registry.client.get_latest_version("totals-value").schema
    assert registered.schema_type == "AVRO" and "Total" in registered.schema_str


async def test_json_schema_both_ways_with_confluents_serializers() -> None:
    registry = flowkit.SchemaRegistry("mock://interop-json")
    app, orders, totals = make_app(flowkit.JsonSchema, registry)
    theirs = json.dumps(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "customer": {"type": "string"}},
            "required": ["id", "customer"],
        }
    )
    written = JSONSerializer(theirs, registry.client)({"id": 7, "customer": "ann"}, ctx("orders"))
    async with TestDriver(app) as driver:
        await driver.send_raw(orders, written)
        await driver.run_until_idle()
        [out] = await driver.messages(totals)
    assert JSONDeserializer(None, schema_registry_client=registry.client)(
        out.value, ctx("totals")
    ) == {"customer": "ann", "amount_cents": 0}


@pytest.mark.parametrize(
    ("make_driver", "fmt"),
    [
        ("memory", flowkit.Avro),
        ("memory", flowkit.JsonSchema),
        # On Kafka for its envelopes (a tombstone among them), through both clients; one
        # format is enough there.
        pytest.param("kafka", flowkit.Avro, marks=pytest.mark.kafka),
        pytest.param("rdkafka", flowkit.Avro, marks=pytest.mark.kafka),
    ],
    indirect=["make_driver"],
    ids=["memory-avro", "memory-json", "kafka-avro", "rdkafka-avro"],
)
async def test_undecodable_records_are_dead_lettered_at_decode(
    fmt: Any, make_driver: DriverFactory
) -> None:
    registry = flowkit.SchemaRegistry(f"mock://dlq-{fmt.__name__}")
    app, orders, totals = make_app(fmt, registry)
    # A writer's schema the type cannot read: the customer is a number.
    kind, text = (
        (
            "AVRO",
            json.dumps(
                {
                    "type": "record",
                    "name": "Order",
                    "fields": [
                        {"name": "id", "type": "long"},
                        {"name": "customer", "type": "long"},
                    ],
                }
            ),
        )
        if fmt is flowkit.Avro
        else (
            "JSON",
            json.dumps(
                {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "customer": {"type": "integer"}},
                    "required": ["id", "customer"],
                }
            ),
        )
    )
    wrong = registry.client.register_schema("elsewhere-value", Schema(text, kind))
    bad = {
        b"\x00\x00\x00\x03\xe7payload": "unknown schema id 999",
        b"\x00" + wrong.to_bytes(4, "big") + b"\x02\x04": (
            f"schema id {wrong} cannot be read as Order: field 'customer': expected string, "
            f"found {'long' if fmt is flowkit.Avro else 'integer'}"
        ),
        b'{"id": 1, "customer": "ann"}': "not in the Schema Registry wire format",
        b"\x00": "not in the Schema Registry wire format",
        None: "tombstone: the record has no value",
    }
    async with make_driver(app) as driver:
        for data in bad:
            await driver.send_raw(orders, data)
        await driver.send(orders, Order(1, "ann", 5))
        await driver.run_until_idle()
        dead = await driver.dead_letters()
        assert [m.value for m in await driver.messages(totals)] == [totals.encode(Total("ann", 5))]
    assert [m.value for m in dead] == list(bad)
    for letter, said in zip(dead, bad.values(), strict=True):
        headers = dict(letter.headers)
        assert headers["flowkit.error.stage"] == b"decode"
        assert said in headers["flowkit.error.message"].decode()


async def test_a_worker_does_not_start_on_an_incompatible_subject() -> None:
    registry = flowkit.SchemaRegistry("mock://start-check")
    registry.client.register_schema(
        "orders-value",
        Schema(
            JAVA_ORDER.replace(
                '"name": "customer", "type": "string"', '"name": "customer", "type": "long"'
            ),
            "AVRO",
        ),
    )
    app, _, _ = make_app(flowkit.Avro, registry)
    with pytest.raises(flowkit.GraphError) as raised:
        async with TestDriver(app):
            pass
    assert raised.value.problems == [
        "topic 'orders': Order cannot read version 1 of subject 'orders-value' (BACKWARD): "
        "field 'customer': expected string, found long"
    ]


def test_evolution_behaves_as_backward_says() -> None:
    """Version 1 is ``Order``; each later type is checked as the subject's next version."""

    class Added(flowkit.Record):  # a field added with a default
        id: int
        customer: str
        amount_cents: int = 0
        note: str | None = None
        currency: str = "EUR"

    class Required(flowkit.Record):  # a field added without one
        id: int
        customer: str
        currency: str

    class Removed(flowkit.Record):  # fields removed
        id: int
        customer: str

    class Changed(flowkit.Record):  # a type changed
        id: int
        customer: int

    registry = flowkit.SchemaRegistry("mock://evolution")

    def topic(type_: type) -> Any:
        type_.__name__ = "Order"  # one record name across versions, as Avro matches by it
        return flowkit.App("shop").topic("orders", value_type=type_, codec=flowkit.Avro(registry))

    v1 = topic(Order)
    old = v1.encode(Order(1, "ann", 5))  # registers version 1
    where = "Order cannot read version 1 of subject 'orders-value' (BACKWARD)"
    assert topic(Added).value_codec.verify() == []
    assert topic(Removed).value_codec.verify() == []
    assert topic(Required).value_codec.verify() == [
        f"{where}: field 'currency': expected string with a default (the writer's schema "
        "has no such field), found no default"
    ]
    assert topic(Changed).value_codec.verify() == [
        f"{where}: field 'customer': expected long, found string"
    ]
    added = topic(Added)
    assert added.decode(old) == Added(1, "ann", 5)  # the new type reads the old records
    new = added.encode(Added(2, "bob", 7, currency="USD"))  # registers version 2
    assert v1.decode(new) == Order(2, "bob", 7)  # the old type skips the new field
    assert sorted(registry.client.get_versions("orders-value")) == [1, 2]


def test_secrets_stay_out_of_reprs_and_errors() -> None:
    registry = flowkit.SchemaRegistry(
        "http://shop:hunter2@127.0.0.1:9",
        settings={"max.retries": 0, "timeout": 2},
    )
    assert "hunter2" not in repr(registry)
    topic = flowkit.App("shop").topic("orders", value_type=Order, codec=flowkit.Avro(registry))
    with pytest.raises(flowkit.RegistryError) as raised:
        topic.value_codec.verify()  # type: ignore[attr-defined]
    assert "hunter2" not in str(raised.value)
    assert str(raised.value).startswith(
        "schema registry http://***@127.0.0.1:9: subject 'orders-value'"
    )
    assert "\n" not in str(raised.value)


def test_a_registry_without_a_url_says_which_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWKIT_SCHEMA_REGISTRY", raising=False)
    topic = flowkit.App("shop").topic("orders", value_type=Order, codec=flowkit.Avro())
    with pytest.raises(flowkit.ConfigurationError, match="FLOWKIT_SCHEMA_REGISTRY"):
        topic.encode(Order(1, "ann"))
    monkeypatch.setenv("FLOWKIT_SCHEMA_REGISTRY", "mock://from-env")
    assert topic.decode(topic.encode(Order(1, "ann"))) == Order(1, "ann")


async def test_a_group_by_hop_registers_nothing_under_the_source_subject() -> None:
    from examples import schema_registry as example

    registry = flowkit.SchemaRegistry("mock://example")
    app = example.make_app(registry)
    writer = AvroSerializer(registry.client, json.dumps(example.THEIR_ORDER))
    order = {"id": 1, "customer": "ann", "amount_cents": 5, "placed_by": "web"}
    async with TestDriver(app) as driver:
        await driver.send_raw("orders", writer(order, ctx("orders")))
        await driver.run_until_idle()
        assert await driver.values("customer-totals") == [example.CustomerTotal("ann", 5)]
    assert registry.client.get_versions("orders-value") == [1]  # theirs alone
    assert sorted(registry.client.get_subjects()) == ["customer-totals-value", "orders-value"]


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=64), framed=st.booleans())
def test_any_bytes_decode_or_raise_one_decode_error(payload: bytes, framed: bool) -> None:
    data = HOSTILE_HEADER + payload if framed else payload
    for codec in HOSTILE_CODECS:
        try:
            codec.decode(data)
        except flowkit.DecodeError as exc:
            assert "\n" not in str(exc)


HOSTILE_REGISTRY = flowkit.SchemaRegistry("mock://hostile")
HOSTILE_CODECS = [
    flowkit.App("h").topic("orders", value_type=Order, codec=fmt(HOSTILE_REGISTRY)).value_codec
    for fmt in (flowkit.Avro, flowkit.JsonSchema)
]
HOSTILE_HEADER = HOSTILE_CODECS[0].encode(Order(1, "ann"))[:5]  # Avro's, registered


def test_a_key_codec_uses_the_key_subject() -> None:
    registry = flowkit.SchemaRegistry("mock://keys")
    topic = flowkit.App("shop").topic(
        "orders", value_type=Order, key_codec=flowkit.Avro(registry), codec=flowkit.Avro(registry)
    )
    key = topic.encode_key("ann")
    assert topic.decode_key(key) == "ann"
    assert registry.client.get_latest_version("orders-key").schema.schema_str == '"string"'
    assert (
        AvroDeserializer(registry.client)(key, SerializationContext("orders", MessageField.KEY))
        == "ann"
    )
