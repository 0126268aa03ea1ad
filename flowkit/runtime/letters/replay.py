"""Reading and replaying dead letters (``flowkit dlq show`` and ``flowkit dlq replay``).

A replay sends each letter's original key, value, headers and timestamp back; which letters
were replayed is kept in the dead-letter topic's marker topic (``replayed_topic``): one
compacted record per replayed letter, keyed by its partition and offset, written once the
broker has acknowledged the replayed records. A later replay reads it and skips them.

A marker also holds the letter's fingerprint (``fingerprint``: a digest of its timestamp,
key, value and headers). A dead-letter topic deleted and created again starts its offsets
at 0, and its new letters take the places of old ones: a marker whose fingerprint is not
the letter's does not skip it. (Kafka's topic ids would say the same per topic, but
neither client nor every broker exposes them; the record itself is read anyway.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Mapping, Sequence

from ...deadletter import DeadLetter
from ...records import Message, TopicPartition
from ...transports import Ack, TopicSpec, Transport, read_topic

__all__ = [
    "Marks",
    "fingerprint",
    "mark_replayed",
    "read_dead_letters",
    "read_replayed",
    "replay_dead_letters",
    "replayed",
    "replayed_topic",
]

Marks = Mapping[tuple[int, int], str | None]  # (partition, offset) -> fingerprint


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


async def read_replayed(transport: Transport, dlq_topic: str) -> dict[tuple[int, int], str | None]:
    """The markers of ``dlq_topic``: the fingerprint of the letter replayed from each
    (partition, offset), or None for a marker that holds none."""
    marked: dict[tuple[int, int], str | None] = {}

    def apply(_: TopicPartition, messages: Sequence[Message]) -> None:
        for m in messages:
            partition, _sep, offset = (m.key or b"").decode(errors="replace").partition("@")
            if not (partition.isdigit() and offset.isdigit()):
                continue  # not a marker: someone else's record
            try:
                note = json.loads(m.value or b"")
            except ValueError:
                note = None
            letter = note.get("letter") if isinstance(note, dict) else None
            marked[int(partition), int(offset)] = letter if isinstance(letter, str) else None

    await read_topic(transport, replayed_topic(dlq_topic), apply, client_id="flowkit-dlq-reader")
    return marked


def fingerprint(letter: DeadLetter) -> str:
    """A digest of the dead-letter record: its timestamp, key, value and headers."""
    m = letter.message
    digest = hashlib.sha256()
    for part in (str(m.timestamp).encode(), m.key, m.value):
        digest.update(b"-" if part is None else b"+%d:" % len(part) + part)
    for name, value in m.headers:
        digest.update(b"h%d:" % len(name.encode()) + name.encode())
        digest.update(b"-" if value is None else b"+%d:" % len(value) + value)
    return digest.hexdigest()[:32]


def replayed(letter: DeadLetter, marked: Marks) -> bool:
    """True if a marker says ``letter`` was replayed: one at its place, for it (a marker
    without a fingerprint counts for whatever letter is at its place)."""
    m = letter.message
    place = m.partition, m.offset
    return place in marked and marked[place] in (None, fingerprint(letter))


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
            note["letter"] = fingerprint(letter)
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
