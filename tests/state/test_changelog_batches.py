"""A checkpoint sends its changelog records in batches of at most ``CHANGELOG_BATCH`` a
partition (a window of a million keys closing does not copy them all into one list), and
every change gets there, in order, on tables whose records carry a write time or not."""

from __future__ import annotations

from typing import Any

import pytest

import flowkit
from flowkit.runtime.tables import keeper
from flowkit.testing import TestDriver
from flowkit.transports import MemoryBroker


@pytest.mark.parametrize("ttl", [None, 3600.0])
async def test_every_change_reaches_the_changelog_in_batches(
    monkeypatch: pytest.MonkeyPatch, ttl: float | None
) -> None:
    monkeypatch.setattr(keeper, "CHANGELOG_BATCH", 4)
    app = flowkit.App("batches", partitions=1)
    words = app.topic("words", value_type=str)
    options: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
    counts = app.table("counts", default=int, **options)

    @app.agent(words)
    async def count(stream: flowkit.Stream[str]) -> None:
        async for word in stream:
            counts[word] += 1

    broker = MemoryBroker()
    sizes: list[int] = []
    append_batch = broker.append_batch

    def counted(topic: str, partition: int, records: Any) -> Any:
        if topic == counts.changelog_topic:
            sizes.append(len(records))
        return append_batch(topic, partition, records)

    broker.append_batch = counted  # type: ignore[method-assign]
    sent = [f"w{i}" for i in range(11)] + ["w3", "w10"]
    async with TestDriver(app, broker=broker) as driver:
        for word in sent:
            await driver.send(words, word, key=word)
        await driver.run_until_idle()
    assert sizes and max(sizes) <= 4 and sum(sizes) == 11, sizes
    logged = [(m.key, m.value) for m in broker.messages(counts.changelog_topic, 0)]
    assert len(logged) == 11  # each key once: its latest value at the checkpoint
    assert {k: v for k, v in logged} == {
        f"w{i}".encode(): (b"2" if i in (3, 10) else b"1") for i in range(11)
    }
