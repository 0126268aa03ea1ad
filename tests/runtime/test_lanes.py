"""A topic's ``Lane`` places records by the rules written once: a record's size as
``record_size`` counts it, a key's partition as Kafka's default partitioner picks it; the
emitter, whose compiled loop has ``Lane.add``'s rule written in, places outputs as it does
(for fan-outs and ``Output(to=...)``, see test_fanout.py)."""

from __future__ import annotations

import asyncio

from hypothesis import example, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.agents import Output
from flowkit.errors import RecordRejected
from flowkit.partitioning import partition_for_key
from flowkit.records import Headers, Message, record_size
from flowkit.runtime.output.emitter import Emitter
from flowkit.runtime.output.lanes import KeyPartitions, Lane, Origin
from flowkit.runtime.output.publisher import Publisher
from flowkit.runtime.output.targets import Target
from flowkit.transports import MemoryTransport, OutRecord

keys = st.none() | st.binary(max_size=6)
values = st.none() | st.binary(max_size=40)
headers = st.lists(
    st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=8)), max_size=3
).map(tuple)
records = st.lists(st.tuples(keys, values, headers), max_size=30)


@settings(max_examples=30, deadline=None)
@given(
    records=records,
    count=st.integers(1, 6),
    limit=st.integers(0, 60),
    rounds=st.integers(0, 7),
)
def test_a_lane_places_each_record_by_size_and_partition(
    records: list[tuple[bytes | None, bytes | None, Headers]],
    count: int,
    limit: int,
    rounds: int,
) -> None:
    lane = Lane("t", limit)
    lane.known(count, KeyPartitions(count))
    for _ in range(rounds):  # the round's partition of keyless records moves on
        lane.add(None, None, (), None)
        lane.take()
    spread = lane.spread
    assert spread == rounds % count
    expected: list[list[OutRecord]] = [[] for _ in range(count)]
    for n, (key, value, hs) in enumerate(records):
        fits = record_size(key, value, hs) <= limit
        assert lane.add(key, value, hs, n) is fits
        if fits:
            p = spread if key is None else partition_for_key(key, count)
            expected[p].append((key, value, hs, None))
    loose, placed = lane.take()
    assert loose == ([], [])
    got = {p: (rs, origins) for p, rs, origins in placed}
    for p, want in enumerate(expected):
        rs, origins = got.get(p, ([], []))
        assert rs == want  # in the order they came
        assert [records[i][:2] for i in origins] == [(k, v) for k, v, _, _ in want]  # type: ignore[call-overload]
    assert not lane.queued()


def test_records_wait_loose_until_the_partition_count_is_known() -> None:
    lane = Lane("t", 100)
    assert not lane.add(b"k", b"v", (), "origin")  # not placed: the publisher holds it
    lane.put(b"k", b"v", (), "origin", 5)
    assert lane.queued()
    assert lane.take() == (([(b"k", b"v", (), 5)], ["origin"]), [])
    lane.known(3, KeyPartitions(3))
    lane.put(b"k", b"v", (), "origin")
    assert lane.take()[1] == [(partition_for_key(b"k", 3), [(b"k", b"v", (), None)], ["origin"])]


def test_lanes_of_one_partition_count_share_their_keys() -> None:
    shared = KeyPartitions(4)
    first, second = Lane("a", 100), Lane("b", 100)
    first.known(4, shared)
    second.known(4, shared)
    first.add(b"foobar", b"", (), None)
    assert dict(second.keys) == {b"foobar": partition_for_key(b"foobar", 4)}


KEPT = b"kept"  # the key of the record whose outputs are placed
outputs = st.lists(st.tuples(st.just(KEPT) | keys, values, headers), max_size=12)


@settings(max_examples=30, deadline=None)
@given(outs=outputs, count=st.integers(1, 5), limit=st.integers(1, 50))
# Records of exactly the limit, and one byte over it: kept key, own key, headers, null.
@example(outs=[(KEPT, b"123456", ()), (KEPT, b"1234567", ())], count=2, limit=10)
@example(
    outs=[(b"k", b"12345", (("h", b"ab"),)), (b"k", b"123456", (("h", b"ab"),))], count=3, limit=9
)
@example(outs=[(None, b"12", (("h", None),)), (None, b"123", (("h", None),))], count=1, limit=3)
def test_the_emitter_places_outputs_as_lane_add_does(
    outs: list[tuple[bytes | None, bytes | None, Headers]], count: int, limit: int
) -> None:
    # The emitter's compiled loop has ``Lane.add``'s rule written in, sizes counted in
    # parts: the two place the same records in the same partitions, and refuse the same
    # ones (over the size limit).
    app = flowkit.App("t")
    topic: flowkit.Topic[bytes] = app.topic("out", partitions=count)
    agent: flowkit.Agent[bytes] = app.agent(app.topic("in"), per_record=True)(lambda v: v)
    cause = Message("in", 0, 5, 0, KEPT, b"v")

    async def partitions(name: str) -> int:
        return count

    async def place() -> None:
        publisher = Publisher(
            MemoryTransport(max_record_bytes=limit).producer(), partition_count=partitions
        )
        publisher.lane("out")
        await publisher.prepare()
        target = Target(topic=topic, encode=lambda v: v)
        emitter = Emitter(agent, None, [target], None, publisher)  # type: ignore[arg-type]
        reference = Lane("out", limit)
        reference.known(count, KeyPartitions(count))
        for key, value, hs in outs:
            out = value if key is KEPT and not hs else Output(value, key=key, headers=hs)
            fits = reference.add(key, value, hs, Origin(cause, agent.name))
            try:
                emitter.place((out,), cause)
            except RecordRejected:
                assert not fits
            else:
                assert fits
        assert publisher.lane("out").parts == reference.parts

    asyncio.run(place())
