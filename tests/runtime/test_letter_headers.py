"""Dead letters built in a batch carry exactly the headers ``failure_headers`` makes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowkit.deadletter import describe_failure, failure_headers, fit_dead_letter
from flowkit.errors import ProcessingError
from flowkit.metrics import Metrics
from flowkit.partitioning import partition_for_key
from flowkit.records import Message
from flowkit.runtime.letters.sending import LetterSender
from flowkit.runtime.observe.logbudget import LogBudget
from flowkit.runtime.output.publisher import Publisher
from flowkit.testing import FakeClock
from flowkit.transports import MemoryTransport


def sender(publisher: Publisher, clock: FakeClock) -> LetterSender:
    return LetterSender(
        publisher=publisher,
        default_topic="app-dlq",
        clock=clock,
        metrics=Metrics(),
        counter=lambda metric, *labels: metric.labels(*labels),
        log_budget=LogBudget(clock.monotonic),
        fail_fast=False,
    )


def publisher(limit: int | None, partitions: int | None) -> Publisher:
    """A publisher whose dead-letter topic has ``partitions`` (None: not known yet)."""

    async def count(topic: str) -> int | None:
        return partitions

    made = Publisher(MemoryTransport(max_record_bytes=limit).producer(), partition_count=count)
    if partitions is not None:
        made.lane("app-dlq")
        asyncio.run(made.prepare())
    return made


def placed(publisher: Publisher) -> list[tuple[Any, ...]]:
    """What the lane of the dead-letter topic holds: (partition or None if loose, value,
    key, headers, letter) per record, in order per partition."""
    lane = publisher.lane("app-dlq")
    out = [(None, v, k, h, o) for (k, v, h, _), o in zip(*lane.loose, strict=True)]
    for p, (records, origins) in enumerate(lane.parts or []):
        out += [(p, v, k, h, o) for (k, v, h, _), o in zip(records, origins, strict=True)]
    return out


@pytest.mark.parametrize("partitions", [1, 3, None])
@pytest.mark.parametrize("limit", [None, 600, 10_000])
def test_a_batch_of_letters_has_the_headers_of_failure_headers(
    limit: int | None, partitions: int | None
) -> None:
    errors = [ValueError("bad"), KeyError("k"), ProcessingError("no")]
    messages = [
        Message(
            "in",
            p % 3,
            1000 + n,
            5000 + n,
            None if n % 4 == 0 else b"k%d" % n,
            None if n % 7 == 0 else b"v" * (n * 13),
            (("trace", b"t"),) if n % 2 else (),
        )
        for n, p in enumerate(range(40))
    ]
    clock = FakeClock()
    out = publisher(limit, partitions)
    letters = sender(out, clock)
    expected = []
    for n, message in enumerate(messages):
        error = errors[n % 3]
        stage, agent, attempts = ("process", "sink")[n % 2], (None, "a", "b")[n % 3], 1 + n % 2
        failed_at_ms = int(clock.time() * 1000)
        headers = failure_headers(
            message,
            describe_failure(error),
            stage=stage,
            agent=agent,
            attempts=attempts,
            failed_at_ms=failed_at_ms,
        )
        value, cut = fit_dead_letter(message.key, message.value, headers, limit)
        if partitions is None:
            where = None
        elif message.key is None:
            where = 0  # this round's partition for keyless records
        else:
            where = partition_for_key(message.key, partitions)
        expected.append((where, value, message.key, cut, headers))
        asyncio.run(letters.send(message, error, stage=stage, agent=agent, attempts=attempts))
        if n % 5 == 4:
            asyncio.run(clock.advance(0.0123))
    letters.build()
    got = placed(out)
    # Each letter where the publisher's ``place`` would have put it, in order per partition,
    # with the headers of ``failure_headers`` (cut to fit as ``fit_dead_letter`` cuts them).
    by_place = sorted(range(len(expected)), key=lambda i: expected[i][0] or 0)
    assert [g[:4] for g in got] == [expected[i][:4] for i in by_place]
    # The origin of each send is its letter: its headers are those before any cut.
    assert [g[4].headers for g in got] == [expected[i][4] for i in by_place]
    assert [g[4].message for g in got] == [messages[i] for i in by_place]
    assert any(len(h) > 13 for *_, h, _ in expected) == (limit == 600)  # some were cut
