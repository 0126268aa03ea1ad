"""Orders joined with their payments: a windowed stream-stream join.

    flowkit worker examples.payments:app

Orders and payments arrive on two topics, both keyed by order id (so they are
co-partitioned). A payment belongs to an order when it comes at most 60 s before or
after it. The join is a left join: every order comes out, with its payment once one
arrives, or with none once its window has closed (60 s after the order, plus 10 s of
grace for records out of order). Paid orders go to ``paid-orders``; orders nobody paid
go to ``unpaid-orders``.

``make_app(generate=True)`` adds a task that produces orders and payments continuously;
``sample(n)`` makes a fixed data set for the tests and the benchmark.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import flowkit

PARTITIONS = 4
WITHIN = 60.0
GRACE = 10.0


class Order(flowkit.Record):
    """An order placed by a customer."""

    id: str
    customer: str
    amount: int  # cents


class Payment(flowkit.Record):
    """A payment for one order."""

    order_id: str
    amount: int  # cents
    method: str


class PaidOrder(flowkit.Record):
    """An order and the payment that settled it."""

    id: str
    customer: str
    amount: int
    method: str


class UnpaidOrder(flowkit.Record):
    """An order no payment matched within the window."""

    id: str
    customer: str
    amount: int


Sample = tuple[str, str, flowkit.Record, int]
"""(topic, key, value, timestamp ms) of one record of a data set."""


def sample(
    n: int, *, start_ms: int, seed: int = 7, unpaid: float = 0.1, prefix: str = "o"
) -> list[Sample]:
    """``n`` orders, one every 100 ms, and a payment for most of them, up to 20 s after
    (or 2 s before) their order; in timestamp order, as they would arrive."""
    rng = random.Random(seed)
    out: list[Sample] = []
    for i in range(n):
        ts = start_ms + i * 100
        order = Order(f"{prefix}{i}", f"c{rng.randrange(100)}", rng.randrange(100, 50_000))
        out.append(("orders", order.id, order, ts))
        if rng.random() >= unpaid:
            paid_at = ts + rng.randint(-2_000, 20_000)
            payment = Payment(order.id, order.amount, rng.choice(["card", "wallet", "bank"]))
            out.append(("payments", order.id, payment, paid_at))
    out.sort(key=lambda r: r[3])
    return out


def make_app(*, name: str = "payments", generate: bool = True) -> flowkit.App:
    """The app; ``generate`` adds the live order and payment generator."""
    app = flowkit.App(name, partitions=PARTITIONS)
    orders = app.topic("orders", value_type=Order)
    payments = app.topic("payments", value_type=Payment)
    paid = app.topic("paid-orders", value_type=PaidOrder)
    unpaid = app.topic("unpaid-orders", value_type=UnpaidOrder)
    settled = app.join(orders, payments, within=WITHIN, grace=GRACE, how="left", name="settled")

    @app.agent(settled, sink=[paid, unpaid])
    async def settle(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[flowkit.Output]:
        async for joined in stream:
            order, payment = joined.left, joined.right
            if payment is None:
                yield flowkit.Output(
                    UnpaidOrder(order.id, order.customer, order.amount), key=order.id, to=unpaid
                )
            else:
                yield flowkit.Output(
                    PaidOrder(order.id, order.customer, order.amount, payment.method),
                    key=order.id,
                    to=paid,
                )

    if generate:

        @app.task
        async def produce() -> None:
            """About 100 orders a second, in wall-clock time."""
            n = 0
            while True:
                now = int(time.time() * 1000)
                for topic, key, value, ts in sample(100, start_ms=now, seed=n, prefix=f"o{n}-"):
                    target = orders if topic == "orders" else payments
                    await target.send(value, key=key, timestamp_ms=ts)  # type: ignore[arg-type]
                n += 1
                await asyncio.sleep(1.0)

    return app


app = make_app()
