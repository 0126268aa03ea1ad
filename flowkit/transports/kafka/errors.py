"""aiokafka's exceptions translated into ``flowkit.errors``, in one place.

``map_kafka_errors`` wraps a block; ``KAFKA_ERRORS`` and ``translate`` serve the hot paths
that catch and translate by hand rather than enter a context manager per call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiokafka.errors as kerr

from ...errors import (
    BrokerUnavailable,
    CommitFailed,
    RecordRejected,
    TransactionAborted,
    TransportError,
)

__all__ = ["KAFKA_ERRORS", "map_kafka_errors", "translate"]

# What aiokafka raises (its stopped-consumer and illegal-operation errors are no KafkaError).
KAFKA_ERRORS = (kerr.KafkaError, kerr.ConsumerStoppedError, kerr.IllegalOperation)
_COMMIT_ERRORS = (
    kerr.CommitFailedError,
    kerr.RebalanceInProgressError,
    kerr.IllegalGenerationError,
    kerr.UnknownMemberIdError,
)
_UNAVAILABLE_ERRORS = (
    kerr.KafkaConnectionError,
    kerr.NodeNotReadyError,
    kerr.NoBrokersAvailable,
    kerr.KafkaUnavailableError,
    kerr.KafkaTimeoutError,
)
# Refusals of one record that no retry will change: the record, not the broker, is at fault.
# (An unknown topic is not among them: Kafka reports it while a topic is being created, and
# aiokafka retries it until request_timeout_ms; it then comes out as KafkaTimeoutError.)
_REJECTED_ERRORS = (
    kerr.MessageSizeTooLargeError,  # over max_request_size, or the broker's message.max.bytes
    kerr.RecordTooLargeError,
    kerr.RecordListTooLargeError,
    kerr.CorruptRecordException,
    kerr.InvalidTimestampError,
    kerr.InvalidTopicError,
    kerr.TopicAuthorizationFailedError,
    kerr.ClusterAuthorizationFailedError,
)


def translate(exc: BaseException, *, commit: bool = False) -> TransportError:
    """The ``flowkit.errors`` exception for the aiokafka exception ``exc``; see
    ``map_kafka_errors``."""
    what = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, kerr.ProducerFenced):  # a transaction's producer, for good
        return TransactionAborted(f"transaction aborted ({what})", fenced=True)
    if isinstance(exc, _COMMIT_ERRORS):
        return CommitFailed(f"commit failed, the group rebalanced ({what})")
    if isinstance(exc, _UNAVAILABLE_ERRORS):
        return BrokerUnavailable(f"Kafka broker unavailable ({what})")
    if isinstance(exc, _REJECTED_ERRORS) and not commit:
        return RecordRejected(f"Kafka refused the record ({what})")
    return (CommitFailed if commit else TransportError)(f"Kafka request failed ({what})")


@contextmanager
def map_kafka_errors(*, commit: bool = False) -> Iterator[None]:
    """Translate aiokafka exceptions raised inside the block into ``flowkit.errors``.

    ``BrokerUnavailable`` for connection failures, ``CommitFailed`` for commits refused
    because the group rebalanced (and, with ``commit=True``, for every error),
    ``RecordRejected`` for a record refused for good (too large, invalid, not authorised),
    ``TransportError`` for the rest. Other exceptions pass through.

    >>> with map_kafka_errors():
    ...     raise kerr.KafkaConnectionError("Connection at 127.0.0.1:9 closed")
    Traceback (most recent call last):
    flowkit.errors.BrokerUnavailable: Kafka broker unavailable (KafkaConnectionError: ...)
    """
    try:
        yield
    except KAFKA_ERRORS as exc:
        raise translate(exc, commit=commit) from exc
