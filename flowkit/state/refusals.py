"""The records of a table's own topics that no store can take, whatever its format.

Anyone who may write a changelog or a repartition topic may write a record without a key
(Apache Kafka refuses one on a compacted topic, other brokers take it) or without a value
(a repartition topic is not compacted: every broker takes one). flowkit writes neither: a
changelog record is a key and its value (None: deleted), a repartition record a partial
or a marker. A store refuses such a record into its ``rejected`` list, as it does a record
that does not decode, and the worker dead-letters it (stage ``decode``): nothing is passed
over without a trace.

>>> keyless()
DecodeError('not a changelog record: it has no key')
"""

from __future__ import annotations

from ..errors import DecodeError

__all__ = ["keyless", "valueless"]


def keyless() -> DecodeError:
    """Why a changelog record without a key is refused."""
    return DecodeError("not a changelog record: it has no key")


def valueless() -> DecodeError:
    """Why a repartition record without a value is refused."""
    return DecodeError("not a repartition record: it has no value")
