"""An outer join of orders and payments, for the kill -9 test: each result is one string
record of ``jc-out``, ``"key:order id:payment id"`` (``-`` for a side that found no match).
The agent sleeps a little after every fourth result, so that a test can kill it mid-run,
and so that checkpoints come while a record's results are still being handed out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import flowkit

PARTITIONS = 4
WITHIN = 5.0
GRACE = 2.0
DELAY = 0.005  # seconds per four results


class Ev(flowkit.Record):
    id: str


def make_app(store: str = "memory://") -> flowkit.App:
    """The app, with the join's buffers on ``store``."""
    app = flowkit.App("joincrash", partitions=PARTITIONS, commit_interval=0.3, store=store)
    orders = app.topic("jc-orders", value_type=Ev)
    payments = app.topic("jc-payments", value_type=Ev)
    out = app.topic("jc-out", value_type=str)
    paid = app.join(orders, payments, within=WITHIN, grace=GRACE, how="outer", name="paid")

    @app.agent(paid, sink=[out])
    async def match(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[str]:
        n = 0
        async for j in stream:
            yield f"{j.key}:{j.left.id if j.left else '-'}:{j.right.id if j.right else '-'}"
            n += 1
            if n % 4 == 0:
                await asyncio.sleep(DELAY)

    return app


app = make_app()
