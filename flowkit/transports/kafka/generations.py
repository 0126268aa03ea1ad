"""Consumer group generations in aiokafka's transactions (KIP-447), which aiokafka lacks.

A zombie is a worker paused past its session timeout while the group gave its partitions
to another member. Two requests keep it from committing what it processed, as Kafka's
Java client and librdkafka do:

- ``send_offsets`` puts the input offsets in the transaction with TxnOffsetCommit version 3,
  which carries the group generation and member id the offsets were read under: the group
  coordinator refuses them from a member of an older generation (``ILLEGAL_GENERATION``,
  ``UNKNOWN_MEMBER_ID``), so a zombie cannot commit them. aiokafka's own
  ``send_offsets_to_transaction`` sends version 0, without them.
- ``fetch_stable`` makes a consumer ask for its committed offsets with OffsetFetch
  version 7 and ``require_stable``: while offsets of a transaction not yet ended are pending
  for one of its partitions, the coordinator answers ``UNSTABLE_OFFSET_COMMIT`` and the
  consumer asks again. So a new owner does not start from the offsets before a transaction
  a zombie committed a moment after its generation was checked; it waits until the
  transaction has ended, and starts after what it committed. aiokafka sends version 3, which
  answers with the last committed offsets at once.

Both read aiokafka's producer and coordinator from the inside, as checked against the
releases in ``CHECKED_RELEASES``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiokafka.errors as kerr
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.producer.sender import AddOffsetsToTxnHandler
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from ...errors import CommitFailed, ConfigurationError

__all__ = ["CHECKED_RELEASES", "Fetched", "UnstableOffsetCommit", "fetch_stable", "send_offsets"]

CHECKED_RELEASES = ("0.14.",)

_TXN_OFFSET_COMMIT = 28
_OFFSET_FETCH = 9
# The coordinator's answers that the member is not in the group's current generation.
_ZOMBIE = (kerr.IllegalGenerationError, kerr.UnknownMemberIdError)
_FENCED_INSTANCE_ID = 82
_UNSTABLE_OFFSET_COMMIT = 88


class UnstableOffsetCommit(kerr.KafkaError):  # type: ignore[misc]
    """A partition's offsets are part of a transaction not ended yet: ask again."""

    errno = _UNSTABLE_OFFSET_COMMIT
    message = "UNSTABLE_OFFSET_COMMIT"
    description = "offsets of a transaction not yet ended are pending for this partition"
    retriable = True


# --- TxnOffsetCommit version 3 -----------------------------------------------------------


class _TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]
    API_KEY = _TXN_OFFSET_COMMIT
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = _TXN_OFFSET_COMMIT
    API_VERSION = 3
    RESPONSE_TYPE = _TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _TxnOffsetCommit(Request[_TxnOffsetCommitRequest_v3]):  # type: ignore[misc]
    API_KEY = _TXN_OFFSET_COMMIT

    def __init__(self, *fields: Any) -> None:
        self._fields = fields

    def build(self, request_struct_class: type[_TxnOffsetCommitRequest_v3]) -> Any:
        return request_struct_class(*self._fields)


async def send_offsets(
    producer: Any, generation: tuple[int, str], offsets: Mapping[Any, int], group_id: str
) -> None:
    """Add ``offsets`` (aiokafka ``TopicPartition`` -> the next offset to read) of the group
    ``group_id`` to the open transaction of ``producer`` (an ``AIOKafkaProducer``), with
    ``generation``: the generation id and member id under which the records were read (of
    the assignment, not aiokafka's current ones, which it resets to "none" when it learns
    that the group went on without it: offsets with "none" are not checked).

    Raises ``CommitFailed`` if the group coordinator says the consumer is no longer a
    member of the group's current generation (a zombie), ``ProducerFenced`` if a newer
    producer took the transactional id over, ``ConfigurationError`` if the broker does not
    take TxnOffsetCommit version 3 (Kafka before 2.5), and aiokafka's error for anything else.
    """
    sender = producer._sender
    txn = producer._txn_manager
    # The group joins the transaction first (AddOffsetsToTxn), as aiokafka would do it;
    # its sender then ends the transaction with EndTxn even if nothing else was sent.
    while txn._txn_consumer_group != group_id:
        if not txn.is_in_transaction():  # AddOffsetsToTxn failed for good: raise its error
            txn.wait_for_transaction_end().result()
        node = await sender._find_coordinator(CoordinationType.TRANSACTION, txn.transactional_id)
        await AddOffsetsToTxnHandler(sender, group_id).do(node)  # retried while False
    topics: dict[str, list[tuple[int, int, int, str, dict[int, bytes]]]] = defaultdict(list)
    for tp, offset in sorted(offsets.items()):
        topics[tp.topic].append((tp.partition, offset, -1, "", {}))
    request = _TxnOffsetCommit(
        txn.transactional_id,
        group_id,
        txn.producer_id,
        txn.producer_epoch,
        generation[0],
        generation[1],
        None,
        [(topic, parts, {}) for topic, parts in topics.items()],
        {},
    )
    backoff = sender._retry_backoff
    while True:
        node = await sender._find_coordinator(CoordinationType.GROUP, group_id)
        try:
            response = await sender.client.send(node, request, group=ConnectionGroup.COORDINATION)
        except NotImplementedError as exc:  # no version of ours in the broker's range
            raise ConfigurationError(
                "exactly-once through aiokafka needs a broker that takes TxnOffsetCommit "
                "version 3 (Apache Kafka 2.5 or later); use client=rdkafka with this broker"
            ) from exc
        except (kerr.NodeNotReadyError, kerr.RequestTimedOutError):
            sender._coordinator_dead(CoordinationType.GROUP)
            await asyncio.sleep(backoff)
            continue
        if _answered(sender, response):
            return
        await asyncio.sleep(backoff)


def _answered(sender: Any, response: Any) -> bool:
    """True if every partition's offset is in; False to ask again; raises the rest."""
    retry = False
    for _, partitions, _ in response.topics:
        for _, code, _ in partitions:
            error = kerr.for_code(code)
            if error is kerr.NoError:
                continue
            if error in (kerr.CoordinatorNotAvailableError, kerr.NotCoordinatorError):
                sender._coordinator_dead(CoordinationType.GROUP)
                retry = True
            elif error in (kerr.CoordinatorLoadInProgressError, kerr.UnknownTopicOrPartitionError):
                retry = True
            elif error in _ZOMBIE or code == _FENCED_INSTANCE_ID:
                raise CommitFailed(
                    f"this worker is no longer in its group's generation ({error.__name__})"
                )
            elif error is kerr.InvalidProducerEpoch:
                raise kerr.ProducerFenced()
            else:
                raise error()
    return not retry


# --- OffsetFetch version 7 -----------------------------------------------------------------


class _OffsetFetchResponse_v7(Response):  # type: ignore[misc]
    API_KEY = _OFFSET_FETCH
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class _OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = _OFFSET_FETCH
    API_VERSION = 7
    RESPONSE_TYPE = _OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("partition_indexes", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class _StableOffsetFetch(Request[_OffsetFetchRequest_v7]):  # type: ignore[misc]
    API_KEY = _OFFSET_FETCH

    def __init__(self, group_id: str, partitions: list[tuple[str, list[int]]]) -> None:
        self._fields: tuple[Any, ...] = (group_id, [(t, ps, {}) for t, ps in partitions], True, {})

    def build(self, request_struct_class: type[_OffsetFetchRequest_v7]) -> Any:
        return request_struct_class(*self._fields)


class Fetched:
    """An OffsetFetch answer in the fields aiokafka's coordinator reads (version 3's)."""

    __slots__ = ("error_code", "topics")

    def __init__(self, error_code: int, topics: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        self.error_code = error_code
        self.topics = topics


async def fetch_stable(send: Callable[[Any], Awaitable[Any]], request: Any) -> Any:
    """Send aiokafka's OffsetFetch ``request`` (through ``send``, its coordinator's) as
    version 7 with ``require_stable``, and return the answer as aiokafka reads one.

    A partition whose offsets wait for a transaction to end raises ``UnstableOffsetCommit``,
    which aiokafka retries after its backoff. A broker without version 7 (Kafka before 2.5)
    is sent ``request`` as it is.
    """
    partitions = getattr(request, "_partitions", None)
    if partitions is None:  # all of the group's partitions: not what a member asks
        return await send(request)
    try:
        response = await send(_StableOffsetFetch(request._consumer_group, partitions))
    except NotImplementedError:
        return await send(request)
    topics = []
    for name, parts, _ in response.topics:
        read = []
        for partition, offset, _, metadata, code, _ in parts:
            if code == _UNSTABLE_OFFSET_COMMIT:
                raise UnstableOffsetCommit()
            read.append((partition, offset, metadata or "", code))
        topics.append((name, read))
    return Fetched(response.error_code, topics)
