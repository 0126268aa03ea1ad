"""Orders in Avro from another team's service, totals per customer written back in Avro.

    FLOWKIT_SCHEMA_REGISTRY=http://localhost:8081 flowkit worker examples.schema_registry:app

The ``orders`` topic belongs to a service in another language: it writes Avro records
through the Schema Registry, with an order schema of its own (more fields than this app
reads). The app reads the fields it declares, keeps a running total per customer, and
writes each new total to ``customer-totals`` in Avro, registering its schema there, so
that any registry-aware consumer (Java, Go, Python) can read it.

``python -m examples.schema_registry`` runs it once over the registry client's in-process
registry: the other service's records are written by confluent-kafka's own serialiser.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import flowkit


class Order(flowkit.Record):
    """The fields of the other service's order that this app needs."""

    id: int
    customer: str
    amount_cents: int
    coupon: str | None = None  # added in the order schema's second version


class CustomerTotal(flowkit.Record):
    """What a customer has spent so far."""

    customer: str
    total_cents: int


# The other service's schema, as it registered it (its own namespace and an extra field).
THEIR_ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop.orders",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount_cents", "type": "int"},
        {"name": "placed_by", "type": "string"},
    ],
}


def make_app(registry: flowkit.SchemaRegistry) -> flowkit.App:
    """The app, its topics in Avro through ``registry``."""
    app = flowkit.App("spend")
    orders = app.topic("orders", value_type=Order, codec=flowkit.Avro(registry), external=True)
    totals = app.topic(
        "customer-totals", value_type=CustomerTotal, codec=flowkit.Avro(registry), external=True
    )
    spent = app.table("spent", default=int)

    @app.agent(orders.group_by(lambda o: o.customer, name="by-customer"), sink=[totals])
    async def add_up(stream: flowkit.Stream[Order]) -> AsyncIterator[CustomerTotal]:
        async for order in stream:
            spent[order.customer] += order.amount_cents
            yield CustomerTotal(order.customer, spent[order.customer])

    return app


app = make_app(flowkit.SchemaRegistry())  # the URL from $FLOWKIT_SCHEMA_REGISTRY


async def demo() -> list[dict[str, object]]:
    """Run the app once over an in-process registry; the totals as a Java consumer sees them."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from flowkit.testing import TestDriver

    registry = flowkit.SchemaRegistry("mock://spend")
    their_writer = AvroSerializer(registry.client, json.dumps(THEIR_ORDER))
    context = SerializationContext("orders", MessageField.VALUE)
    demo_app = make_app(registry)
    async with TestDriver(demo_app) as driver:
        for n, (customer, cents) in enumerate([("ann", 250), ("bob", 100), ("ann", 50)]):
            order = {"id": n, "customer": customer, "amount_cents": cents, "placed_by": "web"}
            await driver.send_raw("orders", their_writer(order, context))
        await driver.send_raw("orders", b'{"id": 9}')  # not Avro: a dead letter
        await driver.run_until_idle()
        written = await driver.messages("customer-totals")
        [dead] = await driver.dead_letters()
    print("dead letter:", dict(dead.headers)["flowkit.error.message"].decode())
    their_reader = AvroDeserializer(registry.client)
    totals = [
        their_reader(m.value, SerializationContext("customer-totals", MessageField.VALUE))
        for m in written
    ]
    for total in totals:
        print(total)
    return totals


if __name__ == "__main__":
    asyncio.run(demo())
