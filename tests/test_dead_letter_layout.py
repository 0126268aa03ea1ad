"""flowkit's own dead-letter headers are told apart from the record's by position: they are
the last ones, in a fixed order. A record's own headers named ``flowkit.*`` stay its own,
say nothing about the letter, and come back whole when the letter is replayed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.deadletter import (
    FAILURE_HEADERS,
    TRUNCATION_HEADERS,
    DeadLetter,
    dead_letter_headers,
    fit_dead_letter,
)
from flowkit.records import Headers, Message
from flowkit.runtime.letters.replay import read_dead_letters, replay_dead_letters
from flowkit.testing import TestDriver

# Names a record may carry, flowkit's own among them: each one a record could spoof.
names = st.one_of(
    st.text(max_size=12),
    st.sampled_from(FAILURE_HEADERS + TRUNCATION_HEADERS),
    st.text(max_size=8).map(lambda s: "flowkit." + s),
)
headers_st = st.lists(st.tuples(names, st.one_of(st.none(), st.binary(max_size=12))), max_size=20)


def _letter(headers: Headers, value: bytes = b"v", limit: int | None = None) -> DeadLetter:
    source = Message("orders", 3, 17, 1_234, b"k", value, headers)
    built = dead_letter_headers(
        source, ValueError("bad"), stage="process", agent="a", attempts=1, failed_at_ms=5
    )
    cut, built = fit_dead_letter(b"k", value, built, limit)
    return DeadLetter(Message("app-dlq", 0, 9, 1_234, b"k", cut, built))


def test_flowkits_own_headers_are_the_names_it_writes() -> None:
    letter = _letter((), b"x" * 500, limit=300)
    assert tuple(name for name, _ in letter.message.headers) == (
        FAILURE_HEADERS + TRUNCATION_HEADERS
    )


def test_a_records_own_truncation_header_does_not_make_its_letter_truncated() -> None:
    own = (("flowkit.value.truncated", b"true"), ("flowkit.value.size", b"99999"))
    letter = _letter(own)
    assert letter.recognised and not letter.truncated
    assert letter.original_size == 1 and letter.original_headers == own
    assert "truncated" not in letter.describe()


@settings(max_examples=200, deadline=None)
@given(headers=headers_st, cut=st.booleans())
def test_a_records_headers_come_back_whole_whatever_their_names(
    headers: list[tuple[str, bytes | None]], cut: bool
) -> None:
    value = b"x" * 400
    letter = _letter(tuple(headers), value, limit=300 if cut else None)
    assert letter.recognised
    assert letter.original_headers == tuple(headers)
    assert letter.truncated == cut  # (300 bytes never hold the letter whole)
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "orders",
        3,
        17,
    )
    assert letter.source_timestamp == 1_234 and letter.error_type == "ValueError"
    if cut:
        assert letter.original_size == 400


def test_a_letter_of_another_layout_reads_every_flowkit_header_as_flowkits() -> None:
    # Written by hand, or by something else: the prefix is all there is to go by, and a
    # letter that says it was cut is taken at its word (it is never replayed as whole).
    headers = (
        ("trace", b"t"),
        ("flowkit.source.topic", b"orders"),
        ("flowkit.value.truncated", b"true"),
        ("flowkit.value.size", b"10"),
    )
    letter = DeadLetter(Message("app-dlq", 0, 0, 7, None, b"abc", headers))
    assert not letter.recognised
    assert letter.original_headers == (("trace", b"t"),)
    assert letter.source_topic == "orders" and letter.truncated and letter.original_size == 10
    assert letter.source_timestamp == 7


app = flowkit.App("layout")
orders = app.topic("layout-orders", value_type=int)
again = app.topic("layout-again", value_type=int)


@app.agent(orders)
async def refuse(stream: flowkit.Stream[int]) -> None:
    async for n in stream:
        raise ValueError(f"{n} refused")


OWN: Any = (
    ("trace", b"t"),
    ("flowkit.trace", b"mine"),
    ("flowkit.value.truncated", b"true"),
    ("flowkit.source.topic", b"elsewhere"),
    ("flowkit.empty", None),
)


async def test_a_records_flowkit_headers_round_trip_through_dead_letter_and_replay() -> None:
    async with TestDriver(app) as driver:
        await driver.send(orders, 7, key="k", headers=OWN, timestamp_ms=1_600_000_000_123)
        await driver.run_until_idle()
        letters = await read_dead_letters(driver.transport, "layout-dlq")
        (letter,) = letters
        assert letter.recognised and not letter.truncated
        assert letter.source_topic == "layout-orders"
        assert letter.original_headers == OWN
        assert await replay_dead_letters(driver.transport, letters, "layout-again") == 1
        (replayed,) = await driver.messages(again)
    assert replayed.headers == OWN
    assert replayed.key == b"k" and replayed.value == b"7"
    assert replayed.timestamp == 1_600_000_000_123
