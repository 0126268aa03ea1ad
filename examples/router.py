"""A Kafka router: JSON filters, transforms, fan-out to several topics, DLQ, metrics.

    flowkit worker examples.router:app                        # embedded broker, demo traffic
    flowkit worker examples.router:app --broker kafka://localhost:9092 --web-port 9100

Records on ``orders-in`` are JSON objects. Each route below has a filter and a transform,
both built from plain data (what a config file would hold), and one or more destination
topics: a record goes to every route it matches, each route's output to all of that
route's topics at once. A record that is not a JSON object, or that a transform cannot
handle (a missing field), goes to the dead-letter topic ``router-dlq`` with headers saying
why; a transient error is retried with backoff first. Records no route wants are counted
and dropped. ``--web-port`` serves Prometheus metrics on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import flowkit
from flowkit.routing import Filter, Transform

# What a config file would hold (YAML or JSON): filters and transforms as data.
ROUTES: list[dict[str, Any]] = [
    {
        "name": "big-eu-orders",
        "filter": {
            "and": [
                {"field": "order.total", "op": ">", "value": 1000},
                {"field": "customer.country", "op": "in", "value": ["NL", "BE", "DE", "FR"]},
            ]
        },
        "transform": {"pick": ["order.id", "order.total", "customer.id"]},
        "to": ["orders-big"],
    },
    {
        "name": "express",
        "filter": {"field": "order.express", "op": "is_true"},
        "transform": {
            "build": {"id": "order.id", "ship_to": "customer.country", "kind": {"literal": "x"}}
        },
        "to": ["shipping-express", "audit"],
    },
    {
        "name": "analytics",
        "filter": {"not": {"field": "customer.test", "op": "is_true"}},
        "transform": [
            {"pick": ["order.id", "order.total", "customer.email", "customer.country"]},
            {"hash": "customer.email", "salt": "pepper"},
            {"lower": "customer.country"},
        ],
        "to": ["analytics"],
    },
]


@dataclass(frozen=True)
class Route:
    """One compiled route: fields paths are parsed once, here, not per record."""

    name: str
    accepts: Filter
    reshape: Transform
    to: tuple[str, ...]

    @classmethod
    def from_config(cls, spec: dict[str, Any]) -> Route:
        return cls(
            name=spec["name"],
            accepts=Filter.from_spec(spec["filter"]),
            reshape=Transform.from_spec(spec["transform"]),
            to=tuple(spec["to"]),
        )


def make_app(
    routes: list[dict[str, Any]] = ROUTES,
    *,
    demo_traffic: bool = True,
    name: str = "router",
    source: str = "orders-in",
) -> flowkit.App:
    """The router app for ``routes``; ``demo_traffic`` adds a task producing sample orders.

    ``name`` (the consumer group, and the dead-letter topic ``<name>-dlq``) and ``source``
    let a benchmark run it afresh over a topic of its own.
    """
    app = flowkit.App(name, partitions=4)
    orders = app.topic(source, value_type=dict)
    compiled = [Route.from_config(spec) for spec in routes]
    for name in sorted({topic for route in compiled for topic in route.to}):
        app.topic(name, value_type=dict, external=True)  # read by other services
    unrouted = {"count": 0}
    # What the agent calls per record: each filter's and transform's generated function
    # itself (``.func``), which skips the Filter/Transform wrapper's call (~0.1 us each).
    table = [(route.accepts.func, route.reshape.func, route.to) for route in compiled]

    # Per record: a generator that yields the order's outputs. A record that fails (a
    # transform's missing field) is dead-lettered where it failed and the next one goes
    # on; the stream form (``async for order in stream``) would be restarted after it.
    @app.agent(
        orders,
        sink=[name for route in compiled for name in route.to],
        on_error={TimeoutError: flowkit.Retry(attempts=5, backoff=0.2)},
        per_record=True,
    )
    def route_orders(order: dict[str, Any]) -> Iterator[flowkit.Output]:
        """Send the order to every route it matches; an unmatched order is counted."""
        matched = False
        for accepts, reshape, to in table:
            if accepts(order):
                matched = True
                yield flowkit.Output(reshape(order), to=to)
        if not matched:
            unrouted["count"] += 1

    if demo_traffic:

        @app.task
        async def demo() -> None:
            """A few hundred orders a second, some of them bad."""
            rng = random.Random(3)
            n = 0
            while True:
                n += 1
                await orders.send(sample_order(rng, n), key=f"c{n % 50}")
                if n % 100 == 0:
                    await asyncio.sleep(0.25)

        @app.agent(app.topics["orders-big"])
        async def show(stream: flowkit.Stream[dict[str, Any]]) -> None:
            async for order in stream:
                print(f"big order {order['order']['id']}: {order['order']['total']}", flush=True)

    return app


def sample_order(rng: random.Random, n: int) -> dict[str, Any]:
    """One plausible order; about 1 in 50 lacks the customer (a transform error)."""
    order: dict[str, Any] = {
        "order": {
            "id": f"o{n}",
            "total": round(rng.uniform(5, 2000), 2),
            "express": rng.random() < 0.2,
        },
        "customer": {
            "id": f"c{n % 50}",
            "email": f"user{n % 50}@example.com",
            "country": rng.choice(["NL", "BE", "DE", "FR", "US", "JP"]),
            "test": rng.random() < 0.05,
        },
    }
    if rng.random() < 0.02:
        del order["customer"]
    return order


app = make_app()
