"""Schema Registry formats: records/s decoding and encoding Avro and JSON Schema vs msgspec JSON.

The same records (an order of 8 fields with a nested item list, about 200 bytes of JSON)
go through each topic codec, in this process, over the registry client's in-process
registry (``mock://``: after the first record of a schema id no lookup is made, as with a
real registry):

* ``json``: flowkit's default codec, msgspec JSON straight into the record type;
* ``json-schema``: ``flowkit.JsonSchema``: the wire format's header, then the same msgspec
  decode (no dict on the way);
* ``avro``: ``flowkit.Avro``: fastavro reads a dict, msgspec converts it into the type;
* ``avro (confluent)`` and ``json-schema (confluent)``: confluent-kafka's own
  ``AvroDeserializer``/``JSONDeserializer`` (dicts out, the JSON one validating with
  jsonschema), for context: what decoding costs without flowkit's codecs (over a tenth of
  the records: they are slow).

    python -m benchmarks.formats [--records 50000] [--repeat 5]

Each candidate is timed over a plain ``for`` loop in CPU time of this process (so that a
machine shared with other work does not skew the ratios), taking turns in every round; the
table shows the best round and the ratio to msgspec JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable
from typing import Any

import flowkit


class Item(flowkit.Record):
    sku: str
    quantity: int


class Order(flowkit.Record):
    id: int
    customer: str
    country: str
    amount_cents: int
    currency: str
    placed_at: int
    items: list[Item]
    coupon: str | None = None


def make_orders(n: int, seed: int = 1) -> list[Order]:
    """``n`` orders of 1 to 3 items."""
    rng = random.Random(seed)
    return [
        Order(
            id=i,
            customer=f"c-{rng.getrandbits(32):08x}",
            country=rng.choice(["NL", "DE", "FR"]),
            amount_cents=rng.randint(100, 50_000),
            currency="EUR",
            placed_at=1_700_000_000_000 + i,
            items=[
                Item(f"sku-{rng.randint(1, 999)}", rng.randint(1, 5))
                for _ in range(rng.randint(1, 3))
            ],
            coupon=rng.choice([None, "SPRING"]),
        )
        for i in range(n)
    ]


def codecs(registry: flowkit.SchemaRegistry) -> dict[str, Any]:
    """The value codec of a topic of orders in each format."""
    app = flowkit.App("bench")
    return {
        "json": app.topic("json", value_type=Order).value_codec,
        "json-schema": app.topic(
            "js", value_type=Order, codec=flowkit.JsonSchema(registry)
        ).value_codec,
        "avro": app.topic("avro", value_type=Order, codec=flowkit.Avro(registry)).value_codec,
    }


def confluent_decoders(registry: flowkit.SchemaRegistry) -> dict[str, Callable[[bytes], Any]]:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    avro = AvroDeserializer(registry.client)
    js = JSONDeserializer(None, schema_registry_client=registry.client)
    avro_ctx = SerializationContext("avro", MessageField.VALUE)
    js_ctx = SerializationContext("js", MessageField.VALUE)
    return {
        "avro (confluent)": lambda data: avro(data, avro_ctx),
        "json-schema (confluent)": lambda data: js(data, js_ctx),
    }


def time_round(fn: Callable[[Any], Any], items: list[Any]) -> int:
    gc.disable()
    try:
        start = time.process_time_ns()
        for item in items:
            fn(item)
        return time.process_time_ns() - start
    finally:
        gc.enable()


def race(cases: dict[str, tuple[Callable[[Any], Any], list[Any]]], repeat: int) -> dict[str, float]:
    """Records/s of each case's best round, the cases taking turns."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeat):
        for name, (fn, items) in cases.items():
            best[name] = min(best[name], time_round(fn, items) / len(items))
    return {name: 1e9 / ns for name, ns in best.items()}


def measure(records: int, repeat: int) -> dict[str, dict[str, float]]:
    """Records/s decoding and encoding in each format (the same orders in each)."""
    orders = make_orders(records)
    registry = flowkit.SchemaRegistry("mock://bench")
    by_format = codecs(registry)
    encoded = {name: [c.encode(o) for o in orders] for name, c in by_format.items()}
    for name, codec in by_format.items():  # every format reads back what it wrote
        assert [codec.decode(d) for d in encoded[name][:100]] == orders[:100], name
    decode = {name: (c.decode, encoded[name]) for name, c in by_format.items()}
    for name, fn in confluent_decoders(registry).items():  # slow: a tenth of the records
        decode[name] = (fn, encoded[name.split(" ")[0]][: max(1, records // 10)])
    encode = {name: (c.encode, orders) for name, c in by_format.items()}
    return {"decode": race(decode, repeat), "encode": race(encode, repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results = measure(args.records, args.repeat)
    sizes = {
        n: len(c.encode(make_orders(1)[0]))
        for n, c in codecs(flowkit.SchemaRegistry("mock://size")).items()
    }
    rounds = f"{args.records} orders, best of {args.repeat} rounds"
    print(f"{rounds}; bytes per record: {json.dumps(sizes)}")
    for what, figures in results.items():
        base = figures["json"]
        print(f"\n{what:<25} {'records/s':>12}  vs json")
        for name, rate in figures.items():
            print(f"{name:<25} {rate:>12,.0f}  {rate / base:>6.2f}x")


if __name__ == "__main__":
    main()
