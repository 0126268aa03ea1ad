"""Kafka reads without aiokafka's per-record objects: group-less consumers (table recovery,
global tables, dead letters) and group members alike.

aiokafka's ``getmany`` turns every record of a fetch into a Python ``ConsumerRecord``
(a dataclass built in Python, one generator step a record), and ``KafkaConsumer`` then
turns that into a flowkit ``Message``: about 70% of the CPU time of a table recovery went
to aiokafka's step. ``drain`` builds the ``Message`` straight from the fetch's record
batches (aiokafka's C records), doing what aiokafka's ``PartitionRecords`` does for a
consumer that reads uncommitted records: batches with a bad CRC raise, control batches are
skipped, records before the fetch position are skipped, and the position moves past each
batch. It reads aiokafka's fetcher from the inside, so ``usable`` checks that the parts it
needs are there, and ``drain`` returns None whenever something is not as it expects (an
error waiting in the fetcher, a fetch aiokafka already started reading): the caller then
asks aiokafka's own ``getmany``, which gives the same records. ``Drainer`` keeps the part
of a fetch that one ``getmany`` could not take, rather than fetch it again; kept records
are checked as aiokafka checks a buffered fetch (its assignment still active, the partition
not paused, its position not moved by a seek) before they are handed out.

``send_next`` lets aiokafka's fetcher send the next fetch request before the records of the
one just read are handed out. Otherwise the request waits for the fetcher's task, which
runs only after the agents have processed what was handed out (they run a whole batch in one
step of the event loop): the worker would process, then wait for the broker, then process,
never both at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Iterable
from inspect import GEN_CREATED, getgeneratorstate
from typing import Any

from ...records import Message, TopicPartition

try:
    import aiokafka
    from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
    from aiokafka.errors import CorruptRecordException
    from aiokafka.structs import TopicPartition as _KTP
except ImportError:  # another aiokafka layout: aiokafka's getmany does it all
    FetchResult = PartitionRecords = CorruptRecordException = _KTP = None

# The aiokafka releases whose fetcher internals this module was checked against (record
# by record, in tests/transports/test_kafka_draining.py). Any other release reads through
# aiokafka's own getmany: slower, the same records.
CHECKED_RELEASES = ("0.14.",)

__all__ = ["Drainer", "drain", "send_next", "usable"]

_FETCHER_PARTS = ("_records", "_notify", "_wait_consume_future", "_check_crcs", "_in_flight")
# Event-loop steps from the fetcher's wake-up to its request on the wire: the wait in its
# task returns, the task runs and starts the request's task, which writes the request (one
# more step, in case another task ran first).
_MAX_STEPS = 4
# What aiokafka's getmany does around the fetcher: raise the (group) coordinator's errors,
# and count the time between reads (a group member's max_poll_interval_ms).
_GROUP_PARTS = (("_coordinator", "check_errors"), ("_subscription", "fetch_context"))


def usable(kafka: Any, options: dict[str, Any]) -> bool:
    """True when ``drain`` can read the fetches of this (started) aiokafka consumer: one
    that reads uncommitted records, with an aiokafka whose fetcher (and, for a group
    member, coordinator and subscription) it knows."""
    if FetchResult is None or not aiokafka.__version__.startswith(CHECKED_RELEASES):
        return False
    if options.get("isolation_level", "read_uncommitted") != "read_uncommitted":
        return False  # aborted transactions are filtered by aiokafka's own path
    if not all(hasattr(getattr(kafka, part, None), name) for part, name in _GROUP_PARTS):
        return False
    fetcher = getattr(kafka, "_fetcher", None)
    return fetcher is not None and all(hasattr(fetcher, name) for name in _FETCHER_PARTS)


class Drainer:
    """Reads the fetches of one aiokafka consumer for ``getmany``; a fetch is read whole,
    and what one ``getmany`` could not take is kept for the next (so no fetch is asked for
    twice, and the fetcher asks for the next one at once). ``position`` counts what is
    kept as not read yet."""

    def __init__(self, kafka: Any) -> None:
        self._kafka = kafka
        # Per partition: the records kept, aiokafka's assignment and the position they
        # came with (aiokafka's position is already past them).
        self._rest: dict[TopicPartition, tuple[list[Message], Any, int]] = {}
        # True when the last ``take`` read a fetch whole (so the fetcher may send the next).
        self.refetch = False

    def take(
        self, max_records: int, owned: Container[Any] | None = None
    ) -> dict[TopicPartition, list[Message]] | None:
        """Up to ``max_records`` records, kept ones first, in offset order per partition,
        only of ``owned`` partitions if given; None when aiokafka's ``getmany`` must
        answer instead."""
        out: dict[TopicPartition, list[Message]] = {}
        budget = max_records
        self.refetch = False
        for tp in list(self._rest):
            if not self._check(tp):
                continue
            kept, assignment, end = self._rest[tp]
            if owned is not None and tp not in owned:
                continue
            if len(kept) > budget:
                out[tp] = kept[:budget]
                self._rest[tp] = (kept[budget:], assignment, end)
                return out
            out[tp] = kept
            del self._rest[tp]
            budget -= len(kept)
        if budget == 0:
            return out
        fresh = drain(self._kafka, owned)
        if fresh is None:
            return out or None
        self.refetch = bool(fresh)
        for tp, (messages, assignment, end) in fresh.items():
            if budget < len(messages):
                self._rest[tp] = (messages[budget:], assignment, end)
                messages = messages[:budget]
            if messages:
                out.setdefault(tp, []).extend(messages)
                budget -= len(messages)
        return out

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the first record kept for ``tp``, or None."""
        return self._rest[tp][0][0].offset if self._check(tp) else None

    def _check(self, tp: TopicPartition) -> bool:
        # aiokafka's FetchResult.check_assignment for what is kept: records of an old
        # assignment, or from before a seek, are dropped (aiokafka's position is the one
        # to read from); a paused partition's are dropped and aiokafka's position moved
        # back to the first of them, so they are fetched again once it is resumed.
        entry = self._rest.get(tp)
        if entry is None:
            return False
        kept, assignment, end = entry
        state = assignment.state_value(tp) if assignment.active else None
        if state is not None and state.position == end and not state.paused:
            return True
        del self._rest[tp]
        if state is not None and state.position == end:
            self._kafka.seek(_KTP(tp.topic, tp.partition), kept[0].offset)
        return False

    def forget(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Drop what is kept (of ``partitions``, or all): after a new assignment or a
        revocation they are fetched again if wanted, from aiokafka's position."""
        if partitions is None:
            self._rest.clear()
        else:
            for tp in partitions:
                self._rest.pop(tp, None)


async def send_next(kafka: Any) -> None:
    """Give aiokafka's fetcher the event-loop steps it needs to send its next fetch request
    (after ``drain`` read the last one), unless another fetch is still waiting to be read."""
    fetcher = kafka._fetcher
    for _ in range(_MAX_STEPS):
        if fetcher._records:
            return  # the fetcher sends nothing before that one is read
        if fetcher._in_flight:
            await asyncio.sleep(0)  # the request's task writes it in its first step
            return
        await asyncio.sleep(0)
    # Nothing sent (paused partitions, a backoff): not worth more steps.


def drain(
    kafka: Any, owned: Container[Any] | None = None
) -> dict[TopicPartition, tuple[list[Message], Any, int]] | None:
    """Every record of aiokafka's completed fetches (of ``owned`` partitions if given,
    the others left to wait), each with its assignment and the position past it; None
    when aiokafka's ``getmany`` must answer instead. All of them, however many records
    the caller asked for: aiokafka's fetcher asks a broker for more only once every
    partition's last answer from it is read. So one whole fetch response (at most
    ``fetch_max_bytes``) is unpacked in one go and what the caller does not take is kept."""
    fetcher = kafka._fetcher
    out: dict[TopicPartition, tuple[list[Message], Any, int]] = {}
    for tp, result in list(fetcher._records.items()):
        if owned is not None and tp not in owned:
            continue  # assigned, but on_partitions_assigned has not run yet
        if type(result) is not FetchResult:
            # An error to raise: aiokafka's getmany raises it (after what we return now).
            return out or None
        if not result.check_assignment(tp) or not result.has_more():
            del fetcher._records[tp]  # dropped by aiokafka (unassigned or moved): refetch
            fetcher._notify(fetcher._wait_consume_future)
            continue
        records = result._partition_records
        if (
            type(records) is not PartitionRecords
            or getattr(result, "_assignment", None) is None
            or records._records_iterator is None
            or getgeneratorstate(records._records_iterator) != GEN_CREATED
        ):
            return out or None  # aiokafka started this one: let it finish it
        messages = _unpack(tp, records, fetcher._check_crcs)
        result._update_position()
        result._partition_records = None
        del fetcher._records[tp]
        fetcher._notify(fetcher._wait_consume_future)  # the fetcher asks for more
        if messages:
            out[TopicPartition(tp.topic, tp.partition)] = (
                messages,
                result._assignment,
                records.next_fetch_offset,
            )
    return out


def _unpack(tp: Any, records: Any, check_crcs: bool) -> list[Message]:
    """Every record of one fetch result; moves its ``next_fetch_offset`` past them."""
    topic, partition = tp.topic, tp.partition
    messages: list[Message] = []
    append = messages.append
    position = records.next_fetch_offset
    batches = records._records
    while batches.has_next():
        batch = batches.next_batch()
        if check_crcs and not batch.validate_crc():
            raise CorruptRecordException(f"Invalid CRC - {tp}")
        if not batch.is_control_batch:
            for r in batch:
                offset = r.offset
                if offset < position:
                    continue  # before the fetch position: a batch starts earlier
                headers = r.headers
                append(
                    Message(
                        topic,
                        partition,
                        offset,
                        r.timestamp,
                        r.key,
                        r.value,
                        tuple(headers) if headers else (),
                    )
                )
        # Past the whole batch, as aiokafka: a compacted batch may end after its last record.
        position = batch.next_offset
    records.next_fetch_offset = position
    return messages
