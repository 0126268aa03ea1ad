"""Dead letters built in a batch carry exactly the headers ``failure_headers`` makes."""

from __future__ import annotations

import asyncio
from typing import Any

from flowkit.deadletter import describe_failure, failure_headers, fit_dead_letter
from flowkit.errors import ProcessingError
from flowkit.metrics import Metrics
from flowkit.records import Message
from flowkit.runtime.letters import LetterSender
from flowkit.runtime.logbudget import LogBudget
from flowkit.testing import FakeClock


def sender(limit: int | None, placed: list[Any], clock: FakeClock) -> LetterSender:
    async def relieve() -> None:
        return None

    return LetterSender(
        publish=lambda *a: False,
        place=lambda *a: placed.append(a),
        placed=lambda n: False,
        relieve=relieve,
        max_record_bytes=limit,
        default_topic="app-dlq",
        clock=clock,
        metrics=Metrics(),
        counter=lambda metric, *labels: metric.labels(*labels),
        log_budget=LogBudget(clock.monotonic),
        fail_fast=False,
    )


def test_a_batch_of_letters_has_the_headers_of_failure_headers() -> None:
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
    for limit in (None, 200, 10_000):
        placed: list[Any] = []
        clock = FakeClock()
        letters = sender(limit, placed, clock)
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
            value, headers = fit_dead_letter(message.key, message.value, headers, limit)
            expected.append(("app-dlq", value, message.key, headers))
            asyncio.run(letters.send(message, error, stage=stage, agent=agent, attempts=attempts))
            if n % 5 == 4:
                asyncio.run(clock.advance(0.0123))
        letters.build()
        assert [p[:4] for p in placed] == expected
        assert any(len(h) > 13 for *_, h in expected) == (limit == 200)  # some were cut
