"""``/status``'s newer figures: the latest dead letters (bounded), dead letters per agent,
and latency quantiles from the histogram's buckets."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flowkit
from flowkit.runtime.letters.sending import RECENT_LETTERS
from flowkit.runtime.web.status import quantile, status
from flowkit.testing import TestDriver


class Item(flowkit.Record):
    n: int


def failing(name: str) -> flowkit.App:
    app = flowkit.App(name, partitions=1)
    items = app.topic("items", value_type=Item)

    @app.agent(items)
    async def picky(stream: flowkit.Stream[Item]) -> AsyncIterator[None]:
        async for item in stream:
            if item.n % 2:
                raise KeyError(f"odd {item.n}")
            yield None

    @app.agent(items)
    async def fine(stream: flowkit.Stream[Item]) -> AsyncIterator[None]:
        async for _ in stream:
            yield None

    return app


async def test_the_latest_dead_letters_are_kept_bounded_newest_first() -> None:
    app = failing("statusletters")
    items = app.topics["items"]
    async with TestDriver(app) as driver:
        for n in range(2 * RECENT_LETTERS + 10):  # 25 fail
            await driver.send(items, Item(n), key="k")
        await driver.run_until_idle()
        figures = status(driver.worker)
    letters = figures["letters"]
    assert len(letters) == RECENT_LETTERS
    assert [letter["offset"] for letter in letters] == list(range(49, 9, -2))
    first = letters[0]
    assert first["error"] == "KeyError" and "odd 49" in first["message"]
    assert first["agent"] == "picky" and first["stage"] == "process"
    assert (first["topic"], first["partition"]) == ("items", 0)
    assert first["dead_letter_topic"] == "statusletters-dlq"
    assert first["location"] is not None and "test_web_status.py" in first["location"]
    assert figures["agents"]["picky"]["dead_letters"] == RECENT_LETTERS + 5
    assert "dead_letters" not in figures["agents"]["fine"]
    assert figures["dead_letters"] == RECENT_LETTERS + 5


def test_quantiles_of_a_histogram() -> None:
    buckets = [[0.1, 2.0], [0.5, 10.0], [1.0, 10.0], [math.inf, 12.0]]
    assert quantile(buckets, 0.5) == pytest.approx(0.1 + 0.4 * (6 - 2) / 8)
    assert quantile(buckets, 0.99) == 1.0  # in the +Inf bucket: the last finite bound
    assert quantile([[0.1, 0.0], [math.inf, 0.0]], 0.5) is None


@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=50), st.floats(0.01, 0.99))
def test_a_quantile_lies_in_the_bucket_of_the_true_one(values: list[float], q: float) -> None:
    bounds = [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 50, math.inf]
    buckets = [[float(b), float(sum(v <= b for v in values))] for b in bounds]
    rank = math.ceil(q * len(values))
    true = sorted(values)[rank - 1]
    estimate = quantile(buckets, q)
    assert estimate is not None
    upper = next(b for b in bounds if true <= b)
    lower = max([0.0, *(b for b in bounds if b < upper)])
    assert lower <= estimate <= (upper if upper != math.inf else lower)
