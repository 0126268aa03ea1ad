"""Anyone with produce rights can write a windowed table's repartition topic: a record
flowkit did not write there is dead-lettered, and the table goes on counting."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowkit.state.windowed import wire
from flowkit.testing import TestDriver
from tests import test_sliding
from tests.hostile import hostile_json
from tests.state.test_future_records import T0, Click, window_app

# Records of the repartition topic's shape that are still not flowkit's.
ODD: list[bytes | None] = [
    b'["p", 1]',
    b'["x", 0, 0, "k", 1]',
    b'["p", 0, 7, "k", 1]',  # a source partition the table does not have
    b'["p", 0, -1, "k", 1]',
    b'["w", 0, 2, null, null]',
    b'["p", 0, 0, [[1]], 1]',  # a key that cannot be a table key
    b'["p", "0", 0, "k", 1]',
    b"[" * 5000 + b"]" * 5000,
    b"not json",
    b"",
    None,  # flowkit writes none without a value
]


async def run(values: list[bytes | None]) -> None:
    closed: list[tuple[str, int, int]] = []
    t0 = T0 - 600_000
    async with TestDriver(window_app(closed)) as driver:
        for i, value in enumerate(values):
            await driver.send_raw("win-counts-repartition", value, key=b"k", partition=i % 2)
        for p in range(2):
            await driver.send("clicks", Click("c", t0 + 1000), partition=p)
        await driver.send("clicks", Click("c", t0 + 15_000), partition=0)
        await driver.send("clicks", Click("c", t0 + 15_000), partition=1)
        await driver.run_until_idle()
        await driver.advance(70)
        letters = await driver.dead_letters()
    assert sorted(closed) == [("c", t0, 2), ("c", t0 + 10_000, 2)]
    assert sorted(m.value or b"" for m in letters) == sorted(v or b"" for v in values)
    for letter in letters:
        headers = dict(letter.headers)
        assert headers["flowkit.error.type"] == b"DecodeError"
        assert headers["flowkit.error.stage"] == b"decode"
        assert headers["flowkit.agent"] == b"table:counts"


async def test_records_that_are_not_flowkits_are_dead_lettered() -> None:
    await run(ODD)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(hostile_json, st.binary(max_size=40)), min_size=1, max_size=5))
async def test_any_bytes_on_the_repartition_topic(values: list[bytes]) -> None:
    refused = []
    for value in values:
        try:
            wire.decode_record(value, sources=2)
        except Exception:
            refused.append(value)
    # Only what flowkit itself could have written is taken (and then it counts).
    values = [v for v in values if v in refused]
    if values:
        await run(values)


def test_what_flowkit_writes_is_taken() -> None:
    for record in (wire.partial(0, 1, ("a", 1), {"n": 1}), wire.marker(T0, 0)):
        kind, *_ = wire.decode_record(record, sources=2)
        assert kind == msgspec.json.decode(record)[0]


async def test_a_record_without_a_value_on_a_sliding_tables_repartition_topic() -> None:
    closed: list[Any] = []
    app, hits, _ = test_sliding.sliding_app(closed, [], grace=4, partitions=2)
    async with TestDriver(app) as driver:
        await driver.send_raw("sliding-recent-repartition", None, key=b"k", partition=0)
        t0 = test_sliding.base_ms(driver.clock)  # type: ignore[arg-type]
        await driver.send(hits, test_sliding.Hit("u", t0), key="u")
        await driver.run_until_idle()
        letters = await driver.dead_letters()
    assert [(m.key, m.value) for m in letters] == [(b"k", None)]
    assert dict(letters[0].headers)["flowkit.agent"] == b"table:recent"
