"""``flowkit dlq replay`` marks what it replayed so that the next run skips it; a marker
names the letter it was written for, not only its place, so that when the dead-letter
topic is deleted and created again the new letters at the same places are replayed."""

from __future__ import annotations

from flowkit.deadletter import DeadLetter, dead_letter_headers
from flowkit.records import Message
from flowkit.runtime.letters.replay import (
    mark_replayed,
    read_dead_letters,
    read_replayed,
    replayed,
    replayed_topic,
)
from flowkit.transports import MemoryTransport
from flowkit.transports.memory import MemoryBroker

DLQ = "shop-dlq"


def letter_of(offset: int, failed_at_ms: int) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    source = Message("orders", 0, offset, 1_000 + offset, b"k", b"{", (("trace", b"t"),))
    headers = dead_letter_headers(
        source, ValueError("bad"), stage="process", agent="a", attempts=1,
        failed_at_ms=failed_at_ms,
    )  # fmt: skip
    return b"{", tuple(headers)


def dead_letters(broker: MemoryBroker, *sources: int, at: int) -> None:
    broker.create_topic(DLQ, 1)
    for offset in sources:
        value, headers = letter_of(offset, at)
        broker.append(DLQ, value, key=b"k", headers=headers, partition=0, timestamp_ms=at)


async def test_markers_skip_what_was_replayed_but_not_a_recreated_topics_letters() -> None:
    old = MemoryBroker()
    dead_letters(old, 7, 8, at=1_700_000_000_000)
    transport = MemoryTransport(old)
    first = await read_dead_letters(transport, DLQ)
    await mark_replayed(transport, DLQ, first[:1], now_ms=1_700_000_001_000)
    marked = await read_replayed(transport, DLQ)
    assert [replayed(letter, marked) for letter in first] == [True, False]

    # The dead-letter topic deleted and created again (its markers kept): new letters
    # at the same places are not the replayed ones.
    new = MemoryBroker()
    new.create_topic(replayed_topic(DLQ), 1, compacted=True)
    for m in old.messages(replayed_topic(DLQ), 0):
        new.append(
            m.topic, m.value, key=m.key, headers=m.headers, partition=0, timestamp_ms=m.timestamp
        )
    dead_letters(new, 11, 12, at=1_700_000_500_000)
    again = MemoryTransport(new)
    letters = await read_dead_letters(again, DLQ)
    assert [(m.message.partition, m.message.offset) for m in letters] == [(0, 0), (0, 1)]
    marked = await read_replayed(again, DLQ)
    assert [replayed(letter, marked) for letter in letters] == [False, False]
    # ... while the one replayed, were it there again, would still be skipped.
    assert replayed(DeadLetter(first[0].message), marked)
