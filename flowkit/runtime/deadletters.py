"""Reading and replaying dead letters (``flowkit dlq show`` and ``flowkit dlq replay``).

A replay sends each letter's original key, value, headers and timestamp back; which letters
were replayed is kept in the dead-letter topic's marker topic (``replayed_topic``): one
compacted record per replayed letter, keyed by its partition and offset, written once the
broker has acknowledged the replayed records. A later replay reads it and skips them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence

from ..deadletter import DeadLetter
from ..records import Message, TopicPartition
from ..transports import Ack, TopicSpec, Transport, read_topic

__all__ = [
    "mark_replayed",
    "read_dead_letters",
    "read_replayed",
    "replay_dead_letters",
    "replayed_topic",
]


def replayed_topic(dlq_topic: str) -> str:
    """The topic that marks which letters of ``dlq_topic`` were replayed.

    >>> replayed_topic("shop-dlq")
    'shop-dlq-replayed'
    """
    return f"{dlq_topic}-replayed"


async def read_dead_letters(transport: Transport, topic: str) -> list[DeadLetter]:
    """Every record in the dead-letter ``topic``, oldest first (reads, commits nothing)."""
    messages: list[Message] = []
    await read_topic(
        transport, topic, lambda _, ms: messages.extend(ms), client_id="flowkit-dlq-reader"
    )
    messages.sort(key=lambda m: (m.timestamp, m.partition, m.offset))
    return [DeadLetter(m) for m in messages]


async def read_replayed(transport: Transport, dlq_topic: str) -> set[tuple[int, int]]:
    """The (partition, offset) of each letter of ``dlq_topic`` marked as replayed."""
    marked: set[tuple[int, int]] = set()

    def apply(_: TopicPartition, messages: Sequence[Message]) -> None:
        for m in messages:
            partition, _sep, offset = (m.key or b"").decode(errors="replace").partition("@")
            if partition.isdigit() and offset.isdigit():
                marked.add((int(partition), int(offset)))

    await read_topic(transport, replayed_topic(dlq_topic), apply, client_id="flowkit-dlq-reader")
    return marked


async def replay_dead_letters(
    transport: Transport, letters: list[DeadLetter], to: str | None = None
) -> int:
    """Send each letter's original key, value, headers and timestamp back to its source
    topic (or ``to``); returns how many were sent, once the broker acknowledged them all."""
    producer = transport.producer(client_id="flowkit-dlq-replay")
    await producer.start()
    try:
        pending: list[Awaitable[Ack]] = []
        for letter in letters:
            target = to or letter.source_topic
            if not target:
                continue
            pending.append(
                await producer.send(
                    target,
                    letter.message.value,
                    key=letter.message.key,
                    headers=letter.original_headers,
                    timestamp_ms=letter.source_timestamp,
                )
            )
        await _acked(pending)
        return len(pending)
    finally:
        await producer.aclose()


async def mark_replayed(
    transport: Transport, dlq_topic: str, letters: list[DeadLetter], now_ms: int
) -> None:
    """Mark ``letters`` (of ``dlq_topic``) as replayed at ``now_ms``, in ``replayed_topic``
    (created, compacted, if it does not exist)."""
    name = replayed_topic(dlq_topic)
    await transport.create_topics([TopicSpec(name, 1, compacted=True)])
    producer = transport.producer(client_id="flowkit-dlq-replay")
    await producer.start()
    try:
        pending: list[Awaitable[Ack]] = []
        for letter in letters:
            m = letter.message
            note = {"source": f"{letter.source_topic}/{letter.source_partition}"}
            note["offset"] = str(letter.source_offset)
            note["replayed_at"] = str(now_ms)
            pending.append(
                await producer.send(
                    name, json.dumps(note).encode(), key=f"{m.partition}@{m.offset}".encode()
                )
            )
        await _acked(pending)
    finally:
        await producer.aclose()


async def _acked(pending: list[Awaitable[Ack]]) -> None:
    for ack in pending:
        if not isinstance(ack, Ack):  # (an Ack is a record already stored)
            await ack
