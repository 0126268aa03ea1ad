"""Confluent's wire format: a magic byte 0, the schema id as 4 big-endian bytes, the payload.

Every Schema Registry serialiser (Java, Go, Python, .NET) frames a record this way, so a
record carries the id of the schema it was written with.

>>> frame(7, b"payload")
b'\\x00\\x00\\x00\\x00\\x07payload'
>>> schema_id(frame(7, b"payload"))
7
>>> schema_id(b'{"id": 1}')
Traceback (most recent call last):
flowkit.errors.DecodeError: not in the Schema Registry wire format: ...
"""

from __future__ import annotations

from ..errors import DecodeError

__all__ = ["HEADER_SIZE", "frame", "schema_id"]

HEADER_SIZE = 5
"""The magic byte and the 4-byte schema id."""


def frame(schema_id: int, payload: bytes) -> bytes:
    """``payload`` framed with ``schema_id``."""
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def schema_id(data: bytes) -> int:
    """The schema id ``data`` was written with; ``DecodeError`` when it is not framed."""
    if len(data) < HEADER_SIZE or data[0] != 0:
        raise DecodeError(
            "not in the Schema Registry wire format: expected a magic byte 0 and a 4-byte "
            f"schema id, found {bytes(data[:HEADER_SIZE])!r}"
        )
    return int.from_bytes(data[1:HEADER_SIZE], "big")
