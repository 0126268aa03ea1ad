"""Group-less reads (table recovery, global tables, dead letters) without aiokafka's
per-record objects.

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
of a fetch that one ``getmany`` could not take, rather than fetch it again.
"""

from __future__ import annotations

from inspect import GEN_CREATED, getgeneratorstate
from typing import Any

from ...records import Message, TopicPartition

try:
    from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
    from aiokafka.errors import CorruptRecordException
except ImportError:  # another aiokafka layout: aiokafka's getmany does it all
    FetchResult = PartitionRecords = CorruptRecordException = None

__all__ = ["Drainer", "drain", "usable"]

_FETCHER_PARTS = ("_records", "_notify", "_wait_consume_future", "_check_crcs")


def usable(kafka: Any, options: dict[str, Any]) -> bool:
    """True when ``drain`` can read the fetches of this (started) aiokafka consumer: a
    group-less consumer of uncommitted records, with an aiokafka whose fetcher it knows."""
    if FetchResult is None or options.get("group_id") is not None:
        return False
    if options.get("isolation_level", "read_uncommitted") != "read_uncommitted":
        return False  # aborted transactions are filtered by aiokafka's own path
    fetcher = getattr(kafka, "_fetcher", None)
    return fetcher is not None and all(hasattr(fetcher, name) for name in _FETCHER_PARTS)


class Drainer:
    """Reads the fetches of one group-less aiokafka consumer for ``getmany``; a fetch is
    read whole, and what one ``getmany`` could not take is kept for the next (so no fetch
    is asked for twice). ``position`` counts what is kept as not read yet."""

    def __init__(self, kafka: Any) -> None:
        self._kafka = kafka
        self._rest: dict[TopicPartition, list[Message]] = {}

    def take(self, max_records: int) -> dict[TopicPartition, list[Message]] | None:
        """Up to ``max_records`` records, kept ones first, in offset order per partition;
        None when aiokafka's ``getmany`` must answer instead."""
        out: dict[TopicPartition, list[Message]] = {}
        budget = max_records
        for tp, kept in list(self._rest.items()):
            if len(kept) > budget:
                out[tp], self._rest[tp] = kept[:budget], kept[budget:]
                return out
            out[tp] = kept
            del self._rest[tp]
            budget -= len(kept)
        if budget == 0:
            return out
        fresh = drain(self._kafka, budget)
        if fresh is None:
            return out or None
        for tp, messages in fresh.items():
            if budget < len(messages):
                self._rest[tp] = messages[budget:]
                messages = messages[:budget]
            if messages:
                out.setdefault(tp, []).extend(messages)
                budget -= len(messages)
        return out

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the first record kept for ``tp``, or None."""
        kept = self._rest.get(tp)
        return kept[0].offset if kept else None

    def forget(self) -> None:
        """Drop what is kept (after a new assignment: it is fetched again if wanted)."""
        self._rest.clear()


def drain(kafka: Any, max_records: int) -> dict[TopicPartition, list[Message]] | None:
    """Every record of aiokafka's completed fetches, taken whole until at least
    ``max_records`` are read; None when aiokafka's ``getmany`` must answer instead."""
    fetcher = kafka._fetcher
    out: dict[TopicPartition, list[Message]] = {}
    count = 0
    for tp, result in list(fetcher._records.items()):
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
            out[TopicPartition(tp.topic, tp.partition)] = messages
            count += len(messages)
            if count >= max_records:
                break
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
