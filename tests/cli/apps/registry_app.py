"""An app whose Avro topic's subject holds a schema its record type cannot read."""

from __future__ import annotations

import json

from confluent_kafka.schema_registry import Schema

import flowkit

registry = flowkit.SchemaRegistry("mock://cli-check")
# What another service registered: the amount as text.
registry.client.register_schema(
    "payments-value",
    Schema(
        json.dumps(
            {
                "type": "record",
                "name": "Payment",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "amount_cents", "type": "string"},
                ],
            }
        ),
        "AVRO",
    ),
)


class Payment(flowkit.Record):
    id: int
    amount_cents: int


app = flowkit.App("registry-check")
payments = app.topic("payments", value_type=Payment, codec=flowkit.Avro(registry), external=True)


@app.agent(payments)
async def audit(stream: flowkit.Stream[Payment]) -> None:
    async for _ in stream:
        pass
