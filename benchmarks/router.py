"""Router throughput: the router pattern in flowkit vs a hand-written loop, same data.

    python -m benchmarks.router [--records 10000] [--repeat 5]

Two shapes, each over the same pre-encoded JSON orders (about 250 bytes):

* one destination: filter (2-condition AND) -> pick 3 fields -> one topic;
* three destinations: the same record, reshaped, to three topics at once (fan-out).

flowkit runs ``examples/router.py``-style apps (compiled ``Filter``/``Transform`` from
config, ``Output(to=...)``) on the memory broker, timed until every output is stored; the
hand-written loop decodes, filters, reshapes, encodes and appends to one list per
destination. Filter and transform costs per record are in ``benchmarks/router_filters.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec

import flowkit
from examples.router import sample_order
from flowkit.logs import configure_logging
from flowkit.routing import Filter, Transform
from flowkit.transports import MemoryBroker, MemoryTransport, TopicSpec

FILTER = {
    "and": [
        {"field": "order.total", "op": ">", "value": 100},
        {"field": "customer.test", "op": "is_false"},
    ]
}
TRANSFORM = {"pick": ["order.id", "order.total", "customer.id"], "missing": "skip"}


def payloads(n: int) -> list[bytes]:
    rng = random.Random(5)
    enc = msgspec.json.Encoder()
    return [enc.encode(sample_order(rng, i)) for i in range(n)]


def hand_written(data: list[bytes], fanout: int) -> tuple[float, int]:
    decode = msgspec.json.decode
    encode = msgspec.json.Encoder().encode
    outs: list[list[bytes]] = [[] for _ in range(fanout)]
    start = time.perf_counter()
    for raw in data:
        v = decode(raw)
        order, customer = v["order"], v.get("customer")
        if order["total"] > 100 and customer is not None and customer["test"] is False:
            picked = {
                "order": {"id": order["id"], "total": order["total"]},
                "customer": {"id": customer["id"]},
            }
            for out in outs:
                out.append(encode(picked))
    return time.perf_counter() - start, sum(map(len, outs))


async def with_flowkit(data: list[bytes], fanout: int) -> tuple[float, int]:
    broker = MemoryBroker(retention_records=None)
    transport = MemoryTransport(broker)
    await transport.create_topics([TopicSpec("orders-in", 4)])
    producer = transport.producer()
    for i, raw in enumerate(data):
        await producer.send("orders-in", raw, partition=i % 4)
    app = flowkit.App("bench-router", partitions=4)
    orders = app.topic("orders-in", value_type=dict)
    targets = [app.topic(f"out-{i}", value_type=dict) for i in range(fanout)]
    accepts, reshape = Filter.from_spec(FILTER), Transform.from_spec(TRANSFORM)
    names = tuple(t.name for t in targets)

    @app.agent(orders, sink=targets)
    async def route(stream: flowkit.Stream[dict[str, Any]]) -> AsyncIterator[Any]:
        async for order in stream.filter(accepts):
            yield flowkit.Output(reshape(order), to=names)

    worker = flowkit.Worker(app, transport=transport)
    async with worker:
        start = time.perf_counter()
        while worker.records_in < len(data) or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - start
    outputs = sum(sum(len(broker.messages(t.name, p)) for p in range(4)) for t in targets)
    return elapsed, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description="router throughput vs hand-written")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    configure_logging("warning")
    data = payloads(args.records)
    print(f"{args.records:,} orders of {sum(map(len, data)) / len(data):.0f} bytes")
    print(f"{'destinations':<14}{'hand-written/s':>16}{'flowkit/s':>14}{'ratio':>8}")
    for fanout in (1, 3):
        best_hand = best_flow = float("inf")
        for _ in range(args.repeat):
            gc.collect()
            t_hand, n_hand = hand_written(data, fanout)
            gc.collect()
            t_flow, n_flow = asyncio.run(with_flowkit(data, fanout))
            if n_hand != n_flow:
                raise SystemExit(f"outputs differ: hand {n_hand}, flowkit {n_flow}")
            best_hand, best_flow = min(best_hand, t_hand), min(best_flow, t_flow)
        hand, flow = args.records / best_hand, args.records / best_flow
        print(f"{fanout:<14}{hand:>16,.0f}{flow:>14,.0f}{flow / hand:>8.2f}")


if __name__ == "__main__":
    main()
