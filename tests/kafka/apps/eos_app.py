"""Three agents whose every output says what state it saw, for the exactly-once tests.

- ``tally`` counts the items of each key in a ``Table`` and writes ``"key:seq:count"`` to
  ``eos-tally``: the n-th item of a key has count n, so a record processed twice, or state
  restored out of step with the outputs, shows as a wrong or repeated line.
- ``window`` counts the items of each key per 1-second tumbling window of their event time
  and writes each window's count to ``eos-windows`` when it closes.
- ``match`` joins orders and payments within 5 s and writes ``"key:order:payment"`` to
  ``eos-joined``.

The agents sleep a little now and then, so that a test can kill or pause the worker with
transactions open. ``make_app(store)`` puts every table and the join's buffers on ``store``
(``eos_disk_app``: ``rocksdb://``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import flowkit

PARTITIONS = 4
WINDOW = 1.0
WITHIN = 5.0


class Item(flowkit.Record):
    key: str
    seq: int
    ts: int  # event time, ms


class Ev(flowkit.Record):
    id: str


def make_app(store: str = "memory://") -> flowkit.App:
    """The app, with every table and the join's buffers on ``store``."""
    app = flowkit.App("eos", partitions=PARTITIONS, commit_interval=0.3, store=store)
    items = app.topic("eos-items", value_type=Item)
    tally_out = app.topic("eos-tally", value_type=str)
    windows_out = app.topic("eos-windows", value_type=flowkit.WindowResult)
    orders = app.topic("eos-orders", value_type=Ev)
    payments = app.topic("eos-payments", value_type=Ev)
    joined_out = app.topic("eos-joined", value_type=str)

    counts = app.table("eos-counts", default=int)
    per_window = app.table("eos-per-window", default=int).tumbling(
        WINDOW, grace=0.0, time=lambda item: item.ts, to=windows_out, on_close=None
    )
    paid = app.join(orders, payments, within=WITHIN, grace=0.0, how="inner", name="eos-paid")

    @app.agent(items, sink=[tally_out])
    async def tally(stream: flowkit.Stream[Item]) -> AsyncIterator[str]:
        async for item in stream:
            counts[item.key] += 1
            yield f"{item.key}:{item.seq}:{counts[item.key]}"
            if item.seq % 2 == 0:
                await asyncio.sleep(0.002)

    @app.agent(items)
    async def window(stream: flowkit.Stream[Item]) -> None:
        async for item in stream:
            per_window.add(item.key, 1, item.ts)

    @app.agent(paid, sink=[joined_out])
    async def match(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[str]:
        n = 0
        async for j in stream:
            yield f"{j.key}:{j.left.id}:{j.right.id}"
            n += 1
            if n % 4 == 0:
                await asyncio.sleep(0.002)

    return app


app = make_app()
