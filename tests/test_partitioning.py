"""The key partitioner must match Kafka's, so a key lands on the same partition everywhere."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from flowkit.partitioning import murmur2, partition_for_key


def signed(h: int) -> int:
    """Java's int view of an unsigned 32-bit hash."""
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # Kafka's UtilsTest.testMurmur2 vectors
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafkas_test_vectors(data: bytes, expected: int) -> None:
    h = murmur2(data)
    assert 0 <= h < 1 << 32
    assert signed(h) == expected


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [  # checked against aiokafka's DefaultPartitioner
        (b"foobar", 4, 2),
        (b"foobar", 8, 6),
        (b"campaign-42", 4, 3),
        (b"campaign-42", 12, 7),
        (b"user-1", 3, 2),
        (b"user-2", 8, 0),
        (b"", 12, 9),
        (b"a", 1, 0),
    ],
)
def test_known_key_partitions(key: bytes, partitions: int, expected: int) -> None:
    assert partition_for_key(key, partitions) == expected


@given(st.binary(max_size=64))
def test_murmur2_agrees_with_aiokafka(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=128))
def test_partition_for_key_agrees_with_aiokafkas_default_partitioner(
    key: bytes, partitions: int
) -> None:
    every = list(range(partitions))
    assert partition_for_key(key, partitions) == DefaultPartitioner()(key, every, every)
