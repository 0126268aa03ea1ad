"""What a librdkafka ``consume`` returned, as ``getmany``'s batches.

In the consume thread, right after ``consume``: librdkafka's messages filed by partition
as they are (``batches_of``), wrapped as ``RawMessages`` that make a flowkit ``Message``
only of the few records someone reads whole; error events dropped or raised. Under
exactly-once, ``Held`` keeps what is over a partition's byte budget for the next
``getmany``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import confluent_kafka as ck

from ...records import Message, RawMessages, TopicPartition
from .errors import translate

__all__ = ["Held", "batches_of", "runs_of"]


_error_of = ck.Message.error
_partition_of = ck.Message.partition
_topic_of = ck.Message.topic
_value_of = ck.Message.value
_key_of = ck.Message.key


def _message(r: Any) -> Message:
    # One librdkafka message as a flowkit Message: only for the few records a batch whose
    # offset, key, timestamp or headers someone reads (see RawMessages).
    headers = r.headers()  # a list, or None: flowkit's Headers are a tuple
    return Message(
        r.topic(),
        r.partition(),
        r.offset(),
        r.timestamp()[1],
        r.key(),
        r.value(),
        tuple(headers) if headers else (),
    )


def _timestamp_of(r: Any) -> int:
    return r.timestamp()[1]  # type: ignore[no-any-return]


def batches_of(records: list[Any]) -> dict[TopicPartition, RawMessages]:
    # In the consume thread, right after ``consume``: librdkafka's messages filed by
    # partition as they are, not made into Messages (RawMessages makes the few that are
    # asked for). One call per record through ``map`` for each of error, partition and
    # topic, and the runs of one partition sliced whole: about 0.09 us a record where
    # building every Message cost 0.3 us warm and 0.5-0.8 us in a real run.
    return {tp: _raw_messages(run) for tp, run in runs_of(records).items()}


def _raw_messages(run: list[Any]) -> RawMessages:
    return RawMessages(run, _value_of, _message, _key_of, _timestamp_of)


def runs_of(records: list[Any]) -> dict[TopicPartition, list[Any]]:
    # ``batches_of`` before the runs are wrapped: librdkafka's messages per partition, in
    # order.
    if not records:
        return {}
    if any(map(_error_of, records)):  # a KafkaError is true, None false
        records = _without_errors(records)
    parts: list[Any] = list(map(_partition_of, records))
    topics: list[Any] = list(map(_topic_of, records))
    runs: dict[TopicPartition, list[Any]] = {}
    i = 0
    for partition, group in itertools.groupby(parts):
        j = i + len(list(group))
        topic = topics[i]
        if topics[i:j].count(topic) == j - i:
            run = records[i:j]
            got = runs.get(tp := TopicPartition(topic, partition))
            if got is None:
                runs[tp] = run
            else:
                got += run
        else:  # partitions of the same number of two topics, side by side
            for k in range(i, j):
                runs.setdefault(TopicPartition(topics[k], partition), []).append(records[k])
        i = j
    return runs


class Held:
    """The records a budgeted consumer has consumed and not handed over yet, per partition.

    ``take`` hands over, of each partition, the records held first and then the newly
    consumed ones, in offset order, up to ``budget`` bytes of keys and values (at least
    one record); the rest waits for the next ``getmany``. So what the agents hold at a
    checkpoint is bounded by what a fetch returns on aiokafka, not by how far librdkafka
    read ahead. Counting bytes is work per record: only exactly-once consumers do it.
    """

    __slots__ = ("budget", "count", "runs")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.runs: dict[TopicPartition, list[Any]] = {}
        self.count = 0  # records in ``runs``

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget what is held of ``tps`` (assigned again, revoked, or sought)."""
        for tp in tps:
            self.count -= len(self.runs.pop(tp, ()))

    def take(self, consumed: dict[TopicPartition, list[Any]]) -> dict[TopicPartition, RawMessages]:
        """What to hand over now: ``consumed`` after what is held, cut to the budget."""
        runs = self.runs
        for tp, run in consumed.items():
            got = runs.get(tp)
            if got is None:
                runs[tp] = run
            else:
                got += run
            self.count += len(run)
        out: dict[TopicPartition, RawMessages] = {}
        for tp, run in list(runs.items()):
            cut = _within(run, self.budget)
            out[tp] = _raw_messages(run[:cut] if cut < len(run) else run)
            if cut < len(run):
                runs[tp] = run[cut:]
            else:
                del runs[tp]
            self.count -= cut
        return out


def _within(run: list[Any], budget: int) -> int:
    """How many records of ``run``, from its start, fit in ``budget`` bytes (at least one)."""
    size = 0
    for i, r in enumerate(run):
        value, key = r.value(), r.key()
        size += (len(value) if value else 0) + (len(key) if key else 0)
        if size > budget:
            return max(i, 1)
    return len(run)


def _without_errors(records: list[Any]) -> list[Any]:
    # The records of a consume that returned errors too: end-of-partition events are
    # dropped (``enable.partition.eof`` is off, but a setting may turn it on); any other
    # error is raised.
    kept = []
    for r in records:
        error = r.error()
        if error is None:
            kept.append(r)
        elif error.code() != ck.KafkaError._PARTITION_EOF:
            raise translate(ck.KafkaException(error))
    return kept
