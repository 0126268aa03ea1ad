"""The emitter's compiled fan-out loop (``runtime/output/fanout.py``) places outputs as
the same loop written plainly does, one ``Lane.add`` per output: the same records in the
same partitions (or waiting loose), the same refusals, for any outputs of any records.

Hypothesis draws records, each with outputs: plain values or ``Output`` with a key of its
own (or none), headers and a ``to=`` (one topic, several, an unhashable list, a topic
whose partition count is not known yet); values of the wrong type, null values, and
records over the producer's size limit included.
"""

from __future__ import annotations

import asyncio
import functools
import traceback
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.agents import KEEP_KEY, Output
from flowkit.errors import RecordRejected
from flowkit.records import Message
from flowkit.runtime.output.emitter import Emitter
from flowkit.runtime.output.lanes import Origin
from flowkit.runtime.output.publisher import Publisher
from flowkit.runtime.output.targets import Target, Targets
from flowkit.topics import accepts
from flowkit.transports import MemoryTransport

COUNTS = {"a": 2, "b": 3, "c": 2}  # "new": its partition count is not known yet
CHOICES: list[Any] = [None, "a", ("a", "b"), ("b", "c"), ("new", "a"), ["a", "c"]]


@functools.cache
def make_app() -> tuple[flowkit.App, flowkit.Agent[Any], Targets]:
    """One app for every example: its targets are resolved once (as a worker does)."""
    app = flowkit.App("t")
    for name in ("a", "b", "new"):
        app.topic(name, value_type=bytes, partitions=COUNTS.get(name, 1))
    app.topic("c", value_type=int, partitions=2)
    agent: flowkit.Agent[Any] = app.agent(app.topic("in"), per_record=True)(lambda v: v)
    return app, agent, Targets(app, on_give_up=print, spawn=None)


def reference_place(
    outs: list[object],
    cause: Message,
    agent: flowkit.Agent[Any],
    defaults: list[Target],
    targets: Targets,
    publisher: Publisher,
) -> None:
    """``Emitter.place`` written plainly, one ``Lane.add`` per output (topics only)."""
    origin = Origin(cause, agent.name)
    for out in outs:
        chosen, key, headers, value = defaults, KEEP_KEY, (), out
        if isinstance(out, Output):
            value, key, headers = out.value, out.key, tuple(out.headers)
            if out.to is not None:
                chosen = targets.routed(agent, out.to)
        for target in chosen:
            topic = target.topic
            assert topic is not None and target.encode is not None
            checked = target.checked
            if checked is not None and value is not None and not accepts(checked, type(value)):
                raise TypeError(f"{topic.name} refuses {type(value).__name__}")
            data = None if value is None else target.encode(value)
            raw_key = cause.key if key is KEEP_KEY else topic.encode_key(key)
            if publisher.lane(topic.name).add(raw_key, data, headers, origin):
                publisher.placed(1)
            else:  # not known yet, or over the limit (raises, with its message)
                publisher.publish(topic.name, data, raw_key, headers, origin)


keys = st.none() | st.binary(max_size=4)
headers = st.lists(
    st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=6)), max_size=2
).map(tuple)
output = st.tuples(
    st.none() | st.binary(max_size=24) | st.integers(0, 99),
    st.just(KEEP_KEY) | keys,
    headers,
    st.sampled_from(range(len(CHOICES))),
    st.booleans(),
).map(
    lambda o: (
        o[0]
        if o[4] and o[1] is KEEP_KEY and not o[2] and o[3] == 0
        else Output(o[0], key=o[1], headers=o[2], to=CHOICES[o[3]])
    )
)
records = st.lists(st.tuples(keys, st.lists(output, max_size=5)), min_size=1, max_size=8)


def placed(publisher: Publisher) -> dict[str, Any]:
    lanes = {name: publisher.lane(name) for name in ("a", "b", "c", "new")}
    return {name: (lane.parts, lane.loose) for name, lane in lanes.items()}


@settings(max_examples=20, deadline=None)
@given(records=records, limit=st.integers(4, 40), rounds=st.integers(0, 5))
@example(  # a fan-out with its own key and headers: one value sized once, over the limit
    records=[(b"k", [Output(b"12345", key=b"kk", headers=(("h", b"1"),), to=("a", "b"))])],
    limit=8,
    rounds=1,
)
# Records of exactly the limit, and one byte over it: kept key, own key, headers, null.
@example(records=[(b"kept", [b"123456"]), (b"kept", [b"1234567"])], limit=10, rounds=0)
@example(
    records=[(b"k", [Output(v, key=b"k", headers=(("h", b"ab"),)) for v in (b"12345", b"123456")])],
    limit=9,
    rounds=0,
)
@example(
    records=[(b"k", [Output(v, key=None, headers=(("h", None),)) for v in (b"123", b"1234")])],
    limit=4,
    rounds=2,
)
def test_the_compiled_fan_out_places_as_the_plain_loop(
    records: list[tuple[bytes | None, list[object]]], limit: int, rounds: int
) -> None:
    async def run() -> tuple[list[Any], list[Any]]:
        runs = []
        for compiled in (True, False):
            _, agent, targets = make_app()

            async def partitions(name: str) -> int | None:
                return COUNTS.get(name)

            transport = MemoryTransport(max_record_bytes=limit)
            publisher = Publisher(transport.producer(), partition_count=partitions)
            for name in ("a", "b", "c", "new"):
                publisher.lane(name)
            await publisher.prepare()
            for name, count in COUNTS.items():  # keyless records: the round's partition
                publisher.lane(name).spread = rounds % count
            defaults = [targets.resolve(agent, "a"), targets.resolve(agent, "b")]
            emitter = Emitter(agent, None, defaults, targets, publisher)  # type: ignore[arg-type]
            log: list[Any] = []
            for offset, (key, outs) in enumerate(records):
                cause = Message("in", 0, offset, 0, key, b"v")
                try:
                    if compiled:
                        assert emitter.place(iter(outs), cause) is None
                    else:
                        reference_place(outs, cause, agent, defaults, targets, publisher)
                except (TypeError, RecordRejected) as exc:
                    log.append((offset, type(exc).__name__))
                log.append(placed(publisher))
            log.append(publisher.buffered)
            runs.append(log)
        return runs[0], runs[1]

    compiled, reference = asyncio.run(run())
    assert compiled == reference


def test_a_traceback_through_the_fan_out_shows_its_source() -> None:
    async def run() -> str:
        _, agent, targets = make_app()
        publisher = Publisher(MemoryTransport().producer())
        emitter = Emitter(agent, None, [targets.resolve(agent, "c")], targets, publisher)  # type: ignore[arg-type]
        try:
            emitter.place((b"bytes, not an int",), Message("in", 0, 0, 0, None, b"v"))
        except TypeError:
            return traceback.format_exc()
        raise AssertionError("the output was not refused")

    text = asyncio.run(run())
    assert "<flowkit emitter place>" in text
    assert "raise self._refused(value, topic)" in text  # the generated line
