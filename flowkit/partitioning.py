"""Kafka's default key partitioner, so a key lands on the same partition everywhere.

The memory broker, the Kafka producer and table ownership checks all use this one
function: a table partition owns exactly the keys that the producer sends to it.
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for_key"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Return Kafka's murmur2 hash of ``data`` as an unsigned 32-bit int.

    >>> murmur2(b"21") - 2**32   # Kafka's own test vector: -973932308
    -973932308
    """
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - (length & 3)
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``.

    >>> partition_for_key(b"foobar", 4)
    2
    """
    if partitions == 1:
        return 0  # no hash (murmur2 in Python is ~10 k instructions a key)
    return (murmur2(key) & 0x7FFFFFFF) % partitions
