"""The envelope fuzzer: hostile records on every transport, through every agent form.

The invariant, checked for each record by its offset: the worker never stops or restarts
an agent because of a record; each form processes or dead-letters each record exactly
once, and its dead letter carries the record's own key, value (or the part that fits) and
headers, then flowkit's; the outputs for the valid records are exact.

Sized for CI (``FLOWKIT_FUZZ_EXAMPLES`` examples of up to ``FLOWKIT_FUZZ_RECORDS`` records
per transport; 3 and 40 by default). A long run, as tests/README.md says::

    FLOWKIT_FUZZ_EXAMPLES=200 FLOWKIT_FUZZ_RECORDS=200 pytest tests/envelopes/test_fuzz.py

on the memory broker, Tansu and Apache Kafka, each Kafka with both clients.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flowkit.errors import RecordRejected
from flowkit.partitioning import partition_for_key
from flowkit.records import Message
from flowkit.transports import Ack
from tests.conftest import EVERY_BROKER, DriverFactory

from .envelopes import CUSTOMERS, NOW_MS, Envelope, Order, envelopes
from .forms import AGENT_OF, FORMS, FuzzApp, Written, expected, make_app

EXAMPLES = int(os.environ.get("FLOWKIT_FUZZ_EXAMPLES", "3"))
RECORDS = int(os.environ.get("FLOWKIT_FUZZ_RECORDS", "40"))
BROKERS = EVERY_BROKER
PARTITIONS = 2


def warm_up_keys() -> list[bytes]:
    """A key for each partition of ``orders``: a valid record on each opens stream time,
    so a record stamped 0 is behind every window of its partition."""
    found: dict[int, bytes] = {}
    n = 0
    while len(found) < PARTITIONS:
        key = f"w{n}".encode()
        found.setdefault(partition_for_key(key, PARTITIONS), key)
        n += 1
    return [found[p] for p in range(PARTITIONS)]


async def write(
    driver: Any, fz: FuzzApp, batch: list[Envelope]
) -> tuple[list[Written], list[Order], list[str]]:
    """Send the payments, the warm-up records and ``batch``; what the broker took, where."""
    import msgspec

    payments = [Order(1_000 + i, 1.0, c) for i, c in enumerate(CUSTOMERS)]
    for order in payments:
        await driver.send(
            fz.topics["payments"], order, key=order.customer, timestamp_ms=NOW_MS - 10_000
        )
    warm = [
        Envelope(
            "orders",
            key,
            msgspec.json.encode(Order(-1 - i, 0.0, "c0")),
            (),
            NOW_MS - 15_000,
            "warm-up",
        )
        for i, key in enumerate(warm_up_keys())
    ]
    pending: list[tuple[Envelope, Awaitable[Ack]]] = []
    for e in [*warm, *batch]:
        pending.append(
            (
                e,
                await driver.send_raw(
                    fz.topics[e.topic],
                    e.value,
                    key=e.key,
                    headers=e.headers,
                    timestamp_ms=e.timestamp_ms,
                ),
            )
        )
    refused = []
    for _, ack in pending:
        try:
            await ack
        except RecordRejected:  # Apache Kafka 4.x: a timestamp over an hour ahead, or
            # another record of its broker batch stamped so
            refused.append(ack)  # never written: no worker sees it
    # (The driver would raise them again when it waits for its sends.)
    driver._unacked = [a for a in driver._unacked if all(a is not r for r in refused)]
    # The truth is what the broker holds: a producer may write an envelope otherwise than
    # it was given (librdkafka writes a timestamp of 0 as now, and ends a header name at a
    # NUL; the conformance suite pins each such difference).
    written = []
    for short in ("orders", "refunds"):
        for m in await driver.messages(fz.topics[short]):
            held = Envelope(short, m.key, m.value, tuple(m.headers), m.timestamp)
            written.append(Written(held, m.partition, m.offset))
    assert len(written) == len(pending) - len(refused)
    return written, payments, CUSTOMERS


def letters_by_form(letters: list[Message]) -> dict[str, list[Message]]:
    by: dict[str, list[Message]] = {}
    for letter in letters:
        agent = last_header(letter, "flowkit.agent")
        by.setdefault(agent.decode() if agent else "?", []).append(letter)
    return by


def last_header(message: Message, name: str) -> bytes | None:
    value = None
    for n, v in message.headers:
        if n == name:
            value = v
    return value


def check_letter(letter: Message, e: Envelope) -> None:
    """A dead letter is the record, then flowkit's headers (the value cut only to fit)."""
    assert letter.key == e.key
    assert tuple(letter.headers[: len(e.headers)]) == e.headers
    names = {n for n, _ in letter.headers[len(e.headers) :]}
    assert {"flowkit.error.type", "flowkit.source.offset", "flowkit.agent"} <= names
    if letter.value == e.value:
        return
    size = last_header(letter, "flowkit.value.size")
    assert size is not None and e.value is not None, "value changed without a mark"
    assert int(size) == len(e.value)
    assert letter.value is None or e.value.startswith(letter.value)


@pytest.mark.parametrize("make_driver", BROKERS, indirect=True)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(batch=st.lists(envelopes(), min_size=1, max_size=RECORDS))
# Found by this test: a keyless record beyond the join's guard on stream time, behind
# others of its partition, restarted the join agent (raised out of the merge).
@example(
    batch=[
        *[Envelope("orders", None, b'{"id":0,"amount":0.0,"customer":"c0"}', (), NOW_MS)] * 2,
        Envelope("orders", None, b"", (), 2_015_360_000_000),
    ]
)
@example(  # and one that does not decode, there: dead-lettered for that, once
    batch=[
        Envelope("orders", None, b'{"id":0,"amount":0.0,"customer":"c0"}', (), NOW_MS),
        Envelope("orders", b"c0", b"", (), 2_015_360_000_000),
    ]
)
async def test_no_envelope_stops_a_worker(
    make_driver: DriverFactory, batch: list[Envelope]
) -> None:
    fz = make_app()
    async with make_driver(fz.app) as driver:
        written, payments, pay_keys = await write(driver, fz, batch)
        await driver.run_until_idle(timeout=60)
        undecodable, want = expected(written, payments, pay_keys)
        got: dict[str, Counter[Any]] = {}
        for form in ("each", "per_record", "both"):
            got[form] = Counter(s.id for s in await driver.values(fz.outputs[form]))
        got["paired"] = Counter(await driver.values(fz.outputs["paired"]))
        got["sunk"] = Counter(fz.sunk)
        got["regroup"] = Counter({c: fz.totals[c] for c in CUSTOMERS if fz.totals[c]})
        windowed: Counter[Any] = Counter()
        for key, _ in want["windowed"].outputs:
            for window, count in fz.counts.windows(key).items():
                windowed[(key, window.start)] = count
        got["windowed"] = windowed
        letters = await driver.dead_letters()
    # A group_by agent's body runs twice: before the hop, and after it on the new key.
    # A group_by agent's body runs twice: before the hop, and after it (once a record came).
    assert fz.starts["regroup"] <= 2, f"restarts: {fz.starts}"
    # An error raised in an agent's body (a late record's table update) starts the agent
    # again on the rest of its stream, as the Faust form must; nothing else may.
    raised = Counter(
        AGENT_OF.get(f, f)
        for m in letters
        for f in ("windowed",)
        if (last_header(m, "flowkit.agent") or b"").decode() == f
    )
    assert all(n == 1 + raised[f] for f, n in fz.starts.items() if f != "regroup"), (
        f"restarts: {fz.starts}"
    )
    by_offset = {(w.envelope.topic, w.partition, w.offset): w.envelope for w in written}
    readers = {"orders": set(FORMS), "refunds": {"both"}}
    decode_letters = [m for m in letters if error_type(m) == "DecodeError"]
    sources = [source_of(fz, m) for m in decode_letters]
    assert len(sources) == len(set(sources)), "a record that does not decode dead-lettered twice"
    assert set(sources) == undecodable, (
        f"dead-lettered as undecodable {sorted(set(sources) - undecodable)} unexpectedly, "
        f"missed {sorted(undecodable - set(sources))}"
    )
    for letter, where in zip(decode_letters, sources, strict=True):
        check_letter(letter, by_offset[where])
        agent = (last_header(letter, "flowkit.agent") or b"").decode()
        assert agent in {AGENT_OF.get(f, f) for f in readers[where[0]]}, agent
    by_form = letters_by_form([m for m in letters if error_type(m) != "DecodeError"])
    assert set(by_form) <= {AGENT_OF.get(f, f) for f in FORMS}, set(by_form)
    for form in FORMS:
        mine = by_form.get(AGENT_OF.get(form, form), [])
        sources = [source_of(fz, m) for m in mine]
        assert len(sources) == len(set(sources)), f"{form}: a record dead-lettered twice"
        assert set(sources) == want[form].dead, (
            f"{form}: dead-lettered {sorted(set(sources) - want[form].dead)} unexpectedly, "
            f"missed {sorted(want[form].dead - set(sources))}: "
            f"{[error_type(m) for m in mine]}"
        )
        for letter, where in zip(mine, sources, strict=True):
            check_letter(letter, by_offset[where])
        assert got[form] == want[form].outputs, form


def error_type(letter: Message) -> str:
    return (last_header(letter, "flowkit.error.type") or b"?").decode()


def source_of(fz: FuzzApp, letter: Message) -> tuple[str, int, int]:
    """(topic's short name, partition, offset) of the record a dead letter holds."""
    topic = (last_header(letter, "flowkit.source.topic") or b"").decode()
    partition = int(last_header(letter, "flowkit.source.partition") or -1)
    return fz_topic(fz, topic), partition, int(last_header(letter, "flowkit.source.offset") or -1)


def fz_topic(fz: FuzzApp, name: str) -> str:
    """``orders`` for the app's topic name (which carries the app's prefix)."""
    for short, topic in fz.topics.items():
        if topic.name == name:
            return short
    return name
