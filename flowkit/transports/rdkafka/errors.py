"""librdkafka's errors translated into ``flowkit.errors``, in one place.

confluent-kafka raises ``KafkaException`` carrying a ``KafkaError`` (and hands a
``KafkaError`` to delivery callbacks); ``translate`` maps either by its code.
``map_rdkafka_errors`` wraps a block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from ...errors import (
    BrokerUnavailable,
    CommitFailed,
    RecordRejected,
    TransactionAborted,
    TransportError,
)

__all__ = ["RDKAFKA_ERRORS", "map_rdkafka_errors", "translate"]

RDKAFKA_ERRORS = (KafkaException,)  # KafkaError is a value, raised inside KafkaException

_COMMIT_CODES = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
    }
)
_UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._DESTROY,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


# A newer producer of the same transactional id fenced this one.
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})

# Refused for good, for this record: sending it again would fail again (RecordRejected).
# Or refused with its broker batch, for another record in it (_INVALID_DIFFERENT_RECORD):
# the publisher sends the records of a refusal again apart, to tell which.
_REJECTED_CODES = frozenset(
    {
        KafkaError._INVALID_DIFFERENT_RECORD,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


def translate(exc: BaseException, *, commit: bool = False) -> TransportError:
    """The ``flowkit.errors`` exception for a librdkafka error; see ``map_rdkafka_errors``."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(error, KafkaError):
        code, what = error.code(), f"{error.name()}: {error.str()}"
    else:
        code, what = None, f"{type(exc).__name__}: {exc}"
    if code in _FENCED_CODES:  # a transaction's producer, for good
        return TransactionAborted(f"transaction aborted ({what})", fenced=True)
    if code in _COMMIT_CODES:
        return CommitFailed(f"commit failed, the group rebalanced ({what})")
    if code in _UNAVAILABLE_CODES:
        return BrokerUnavailable(f"Kafka broker unavailable ({what})")
    if code in _REJECTED_CODES and not commit:
        return RecordRejected(f"Kafka refused the record ({what})")
    return (CommitFailed if commit else TransportError)(f"Kafka request failed ({what})")


@contextmanager
def map_rdkafka_errors(*, commit: bool = False) -> Iterator[None]:
    """Translate librdkafka errors raised inside the block into ``flowkit.errors``.

    ``BrokerUnavailable`` for connection failures and timeouts, ``CommitFailed`` for
    commits refused because the group rebalanced (and, with ``commit=True``, for every
    error), ``TransportError`` for the rest. Other exceptions pass through.

    >>> with map_rdkafka_errors():
    ...     raise KafkaException(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    Traceback (most recent call last):
    flowkit.errors.BrokerUnavailable: Kafka broker unavailable (_TRANSPORT: connection refused)
    """
    try:
        yield
    except RDKAFKA_ERRORS as exc:
        raise translate(exc, commit=commit) from exc
