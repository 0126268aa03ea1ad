"""The keys of a join's buffers in RocksDB (the ``rocksdb://`` store): one record, two keys.

* ``b"r"`` + side (1 byte) + key length (4 bytes) + key + timestamp (8 bytes) + offset
  (8 bytes) -> matched (1 byte) + the record's value as read: one key's records of one side
  sit together in timestamp order, so the records of a key within a window are one range;
* ``b"t"`` + side + timestamp + key length + key + offset -> matched (1 byte): each side's
  records in timestamp order, the range that closes windows and expires records;
* ``b"r"`` + side + ``b"\\xff"``: the end of each side's records, always there.

Times and offsets are big-endian, shifted by 2**63, so that they sort in byte order. Two
reserved keys sort before both: ``b"\\x00time"`` (the stream time and the offsets of the
last records done, as the changelog's ``["t"]`` record) and ``b"\\x00top"`` (the highest
offset buffered of each side: a record up to it may be a replay, and is looked up).
"""

from __future__ import annotations

from ..rocks import _bytes

_SHIFT = 2**63

__all__ = [
    "ENDS",
    "MATCHED",
    "RECORD",
    "TIME",
    "TIMES",
    "TOP",
    "UNMATCHED",
    "at",
    "both_keys",
    "record_key",
    "record_key_of",
    "record_prefix",
    "side_end",
    "side_start",
    "side_prefix",
    "time_key",
    "time_of",
    "unpack",
]


def at(value: int) -> bytes:
    """A time or an offset as 8 bytes that sort in its order (past int64: its end)."""
    try:
        return (value + _SHIFT).to_bytes(8, "big")
    except OverflowError:
        return _bytes(value)


TIME = b"\x00time"
TOP = b"\x00top"
RECORD = b"r"
TIMES = b"t"
MATCHED, UNMATCHED = b"\x01", b"\x00"
_SIDES = (b"\x00", b"\x01")
# After each side's records, a key always there: a seek past a side's last record stops
# at it, rather than reading through what follows (the other side's deleted records).
ENDS = (RECORD + b"\x00\xff", RECORD + b"\x01\xff")


def record_prefix(side: int, key: bytes) -> bytes:
    """The start of every stored key of ``key``'s records of ``side``."""
    return b"".join((RECORD, _SIDES[side], len(key).to_bytes(4, "big"), key))


def record_key(side: int, key: bytes, ts: int, offset: int) -> bytes:
    """Where a buffered record is stored: side, key, then time, so that one key's
    records of one side are one range in time order.

    >>> record_key(0, b"k", 0, 1)[:7]
    b'r\\x00\\x00\\x00\\x00\\x01k'
    >>> record_key(1, b"k", 5, 0) < record_key(1, b"k", 6, 0) < record_key(1, b"kk", 0, 0)
    True
    """
    return b"".join((RECORD, _SIDES[side], len(key).to_bytes(4, "big"), key, at(ts), at(offset)))


def both_keys(side: int, key: bytes, ts: int, offset: int) -> tuple[bytes, bytes]:
    """``record_key`` and ``time_key`` of one record, built together.

    >>> both_keys(1, b"k", 5, 9) == (record_key(1, b"k", 5, 9), time_key(1, b"k", 5, 9))
    True
    >>> far = 2**70  # past int64: the end of the range
    >>> both_keys(0, b"k", far, -1) == (record_key(0, b"k", far, -1), time_key(0, b"k", far, -1))
    True
    """
    try:  # ``at`` inlined: a checkpoint builds these for every record it writes
        t, o = (ts + _SHIFT).to_bytes(8, "big"), (offset + _SHIFT).to_bytes(8, "big")
    except OverflowError:
        t, o = at(ts), at(offset)
    s, n = _SIDES[side], len(key).to_bytes(4, "big")
    return b"".join((RECORD, s, n, key, t, o)), b"".join((TIMES, s, t, n, key, o))


def side_start(side: int) -> bytes:
    """Before the time index of ``side``: the lower bound of a range of it.

    >>> side_start(1) < time_key(1, b"k", -(2**63), 0)
    True
    """
    return TIMES + _SIDES[side]


def side_end(side: int) -> bytes:
    """Past the time index of ``side``: the upper bound of a scan of it."""
    return TIMES + _SIDES[side] + b"\xff" * 9


def side_prefix(side: int, ts: int) -> bytes:
    """The start of the time index of ``side`` at ``ts``: its records from then on."""
    return TIMES + _SIDES[side] + at(ts)


def time_key(side: int, key: bytes, ts: int, offset: int) -> bytes:
    """A record's key in the time index of its side.

    >>> time_key(0, b"zz", 5, 0) < time_key(0, b"a", 6, 0) < time_key(1, b"a", 0, 0)
    True
    """
    return b"".join((TIMES, _SIDES[side], at(ts), len(key).to_bytes(4, "big"), key, at(offset)))


def time_of(stored: bytes) -> int:
    """The timestamp of a key of the time index.

    >>> time_of(time_key(1, b"k", -7, 3))
    -7
    """
    return int.from_bytes(stored[2:10], "big") - _SHIFT


def record_key_of(indexed: bytes) -> bytes:
    """The ``record_key`` of a key of the time index: the same parts, reordered.

    >>> record_key_of(time_key(1, b"k", 5, 9)) == record_key(1, b"k", 5, 9)
    True
    """
    return b"".join((RECORD, indexed[1:2], indexed[10:-8], indexed[2:10], indexed[-8:]))


def unpack(stored: bytes) -> tuple[int, bytes, int, int]:
    """(side, key, timestamp, offset) of a key of either kind.

    >>> unpack(record_key(1, b"k", 5, 9)) == unpack(time_key(1, b"k", 5, 9)) == (1, b"k", 5, 9)
    True
    """
    side = stored[1]
    if stored[:1] == RECORD:
        size = int.from_bytes(stored[2:6], "big")
        key = stored[6 : 6 + size]
        ts = int.from_bytes(stored[6 + size : 14 + size], "big") - _SHIFT
    else:
        ts = int.from_bytes(stored[2:10], "big") - _SHIFT
        size = int.from_bytes(stored[10:14], "big")
        key = stored[14 : 14 + size]
    offset = int.from_bytes(stored[-8:], "big") - _SHIFT
    return side, key, ts, offset
