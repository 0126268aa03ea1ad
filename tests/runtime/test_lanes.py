"""A topic's ``Lane`` places records by the rules written once: a record's size as
``record_size`` counts it, a key's partition as Kafka's default partitioner picks it (the
emitter's compiled loop, which has the rule written in, places outputs as ``Lane.add``
does: test_fanout.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flowkit.partitioning import partition_for_key
from flowkit.records import Headers, record_size
from flowkit.runtime.output.lanes import KeyPartitions, Lane
from flowkit.transports import OutRecord

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
