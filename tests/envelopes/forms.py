"""One app with every agent form over the fuzzed topics, and what each form must do.

Every agent reads the same hostile records, so one worker run checks them all:

- ``each``: ``async for`` over ``orders``, yielding to a topic;
- ``per_record``: a plain ``def`` per record over ``orders``, returning to a topic;
- ``both``: one agent over ``orders`` and ``refunds`` (several topics);
- ``regroup``: ``group_by`` customer (a hop through a repartition topic), then a table;
- ``paired``: a stream-stream join of ``orders`` with ``payments`` (valid records the
  test sends first), inner, by record key;
- ``windowed``: a tumbling-window count per record key, time from the record timestamp;
- ``sunk``: ``async for`` with a callable sink.

``expected`` computes, for the records that were written (with their offsets), each
form's exact outputs and the offsets it must dead-letter.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import flowkit

from .envelopes import Envelope, Order, decoded, key_decodes, timestamp_kind

WITHIN_S = 60.0
GRACE_S = 120.0
WINDOW_S = 10.0


class Seen(flowkit.Record):
    id: int
    form: str


@dataclass
class FuzzApp:
    """The app and handles on what its agents produce."""

    app: flowkit.App
    topics: dict[str, flowkit.Topic[Any]]
    outputs: dict[str, flowkit.Topic[Any]]
    totals: Any
    counts: Any
    sunk: list[int] = field(default_factory=list)
    starts: Counter[str] = field(default_factory=Counter)


FORMS = ("each", "per_record", "both", "regroup", "paired", "windowed", "sunk")


def make_app() -> FuzzApp:
    """A fresh app: its own topic names, so examples on one broker never meet."""
    name = f"fz{uuid.uuid4().hex[:8]}"
    app = flowkit.App(name, partitions=2)
    orders = app.topic(f"{name}-orders", value_type=Order)
    refunds = app.topic(f"{name}-refunds", value_type=Order)
    payments = app.topic(f"{name}-payments", value_type=Order)
    outs = {f: app.topic(f"{name}-{f}", value_type=Seen) for f in ("each", "per_record", "both")}
    outs["paired"] = app.topic(f"{name}-paired", value_type=str)
    totals = app.table("totals", default=int)
    counts = app.table("counts", default=int).tumbling(WINDOW_S, grace=GRACE_S)
    paired = app.join(orders, payments, within=WITHIN_S, grace=GRACE_S, name="paired")
    fz = FuzzApp(
        app, {"orders": orders, "refunds": refunds, "payments": payments}, outs, totals, counts
    )

    @app.agent(orders, sink=[outs["each"]])
    async def each(stream: flowkit.Stream[Order]) -> AsyncIterator[Seen]:
        fz.starts["each"] += 1
        async for order in stream:
            yield Seen(order.id, "each")

    @app.agent(orders, sink=[outs["per_record"]], per_record=True)
    def per_record(order: Order) -> Seen:
        return Seen(order.id, "per_record")

    @app.agent([orders, refunds], sink=[outs["both"]])
    async def both(stream: flowkit.Stream[Order]) -> AsyncIterator[Seen]:
        fz.starts["both"] += 1
        async for order in stream:
            yield Seen(order.id, "both")

    @app.agent(orders)
    async def regroup(stream: flowkit.Stream[Order]) -> None:
        fz.starts["regroup"] += 1
        async for order in stream.group_by(lambda o: o.customer, name="by-customer"):
            totals[order.customer] += 1

    @app.agent(paired, sink=[outs["paired"]])
    async def pair(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[str]:
        fz.starts["paired"] += 1
        async for j in stream:
            yield f"{j.key}:{j.left.id}:{j.right.id}"

    @app.agent(orders)
    async def windowed(stream: flowkit.Stream[Order]) -> None:
        fz.starts["windowed"] += 1
        async for event in stream.events():
            if event.key is not None:
                counts[event.key] += 1

    @app.agent(orders, sink=[fz.sunk.append])
    async def sunk(stream: flowkit.Stream[Order]) -> AsyncIterator[int]:
        fz.starts["sunk"] += 1
        async for order in stream:
            yield order.id

    return fz


AGENT_OF = {"paired": "pair"}
"""The agent's name where it is not the form's."""


@dataclass(frozen=True)
class Written:
    """An envelope and where the broker put it."""

    envelope: Envelope
    partition: int
    offset: int


@dataclass
class Expected:
    """What one form must do with the written records."""

    outputs: Counter[Any]
    dead: set[tuple[str, int, int]]  # (topic, partition, offset)


def expected(
    written: Iterable[Written], payments: list[Order], pay_keys: list[str]
) -> tuple[set[tuple[str, int, int]], dict[str, Expected]]:
    """The records that do not decode (dead-lettered once, by one of the topic's readers,
    however many agents read it), then each form's outputs and other dead letters for
    ``written`` (payments: valid, sent first)."""
    undecodable: set[tuple[str, int, int]] = set()
    out = {form: Expected(Counter(), set()) for form in FORMS}
    for w in written:
        e = w.envelope
        where = (e.topic, w.partition, w.offset)
        order = decoded(e.value)
        if order is None:
            undecodable.add(where)
        if e.topic == "refunds":
            if order is not None:
                out["both"].outputs[order.id] += 1
            continue
        if order is not None:
            for form in ("each", "per_record", "both", "sunk"):
                out[form].outputs[order.id] += 1
            out["regroup"].outputs[order.customer] += 1
        # The join and the window read keys and times as well as values.
        kind = timestamp_kind(e.timestamp_ms)
        key = None if e.key is None else e.key.decode() if key_decodes(e.key) else e.key
        if order is None:
            pass  # dead-lettered once, as undecodable
        elif key is None:
            pass  # the agent skips a keyless record: it counts nothing, and no time is read
        elif kind != "normal":
            out["windowed"].dead.add(where)
        else:
            out["windowed"].outputs[(key, e.timestamp_ms // 10_000 * 10_000)] += 1
        if e.key is None or e.value is None:
            # Nothing to join, but its time counts: unless it is beyond max_future.
            if kind == "future":
                out["paired"].dead.add(where)
        elif order is None:
            pass  # dead-lettered once, as undecodable
        elif kind != "normal":
            out["paired"].dead.add(where)
        else:
            for payment, pay_key in zip(payments, pay_keys, strict=True):
                if pay_key.encode() == e.key:
                    out["paired"].outputs[f"{key}:{order.id}:{payment.id}"] += 1
    return undecodable, out
