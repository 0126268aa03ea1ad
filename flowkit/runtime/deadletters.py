"""Reading and replaying dead letters (``flowkit dlq show`` and ``flowkit dlq replay``)."""

from __future__ import annotations

from ..deadletter import DeadLetter
from ..records import Message
from ..transports import Transport, read_topic

__all__ = ["read_dead_letters", "replay_dead_letters"]


async def read_dead_letters(transport: Transport, topic: str) -> list[DeadLetter]:
    """Every record in the dead-letter ``topic``, oldest first (reads, commits nothing)."""
    messages: list[Message] = []
    await read_topic(
        transport, topic, lambda _, ms: messages.extend(ms), client_id="flowkit-dlq-reader"
    )
    messages.sort(key=lambda m: (m.timestamp, m.partition, m.offset))
    return [DeadLetter(m) for m in messages]


async def replay_dead_letters(
    transport: Transport, letters: list[DeadLetter], to: str | None = None
) -> int:
    """Send each letter's original key, value and headers back to its source topic (or
    ``to``); returns how many were sent, once the broker acknowledged them all."""
    producer = transport.producer(client_id="flowkit-dlq-replay")
    await producer.start()
    try:
        pending = []
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
                )
            )
        for ack in pending:
            await ack
        return len(pending)
    finally:
        await producer.aclose()
