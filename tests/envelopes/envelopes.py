"""Hostile Kafka envelopes, as Hypothesis strategies, and what each one is.

An ``Envelope`` is what a producer outside the app's control may write: any key, any
headers (null values, empty or repeated or non-ASCII names, large values, many of them),
any value (a tombstone, nothing, garbage, truncated or deeply nested JSON, huge numbers,
NaN, wrong or missing fields, a record near the producer's size limit) and any timestamp
(0, negative where the client takes it, far in the future). ``classify`` says what a
correct worker does with one, so the fuzzer can check every record by its offset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import strategies as st

import flowkit

NOW_MS = 1_700_000_000_000
"""The test clock's start (``flowkit.testing.FakeClock``), in ms."""

CUSTOMERS = ["c0", "c1", "c2", "c3"]
"""The customers (and keys) of valid records: few, so joins and counts have matches."""

FAR_FUTURE_MS = NOW_MS + 10 * 365 * 86_400_000  # ten years ahead: beyond any max_future
MAX_FUTURE_MS = 3_600_000  # the default max_future, against the test clock (which stays)
TOO_OLD_MS = (0, -1)  # before every window the warm-up opened: late wherever time is kept
NEAR_LIMIT = 1_000_000 - 4_096
"""A value size just under the Kafka clients' default 1 MB request limit: the record fits,
its dead letter (the record plus flowkit's headers) might not."""


class Order(flowkit.Record):
    """The value type of the fuzzed topics."""

    id: int
    amount: float
    customer: str


@dataclass(frozen=True)
class Envelope:
    """One record as a producer sends it; ``topic`` is ``"orders"`` or ``"refunds"``."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int
    note: str = field(default="", compare=False)  # what kind of value, for failure output

    def __repr__(self) -> str:  # short: Hypothesis prints failing examples
        def cut(b: bytes | None) -> str:
            return repr(b) if b is None or len(b) <= 40 else f"<{len(b)} bytes {b[:20]!r}...>"

        heads = [(n[:20], cut(v)) for n, v in self.headers[:4]]
        more = f"+{len(self.headers) - 4}" if len(self.headers) > 4 else ""
        return (
            f"Envelope({self.topic}, key={cut(self.key)}, value={cut(self.value)} [{self.note}], "
            f"headers={heads}{more}, ts={self.timestamp_ms})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis prints a failing example with this


_DECODE = msgspec.json.Decoder(Order)


def decoded(value: bytes | None) -> Order | None:
    """The Order a value holds, or None if a typed topic's reader must reject it."""
    if value is None:
        return None
    try:
        return _DECODE.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None


def key_decodes(key: bytes | None) -> bool:
    """Whether a ``str`` key type reads ``key`` (None is no key, which is fine)."""
    if key is None:
        return True
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def timestamp_kind(ts: int) -> str:
    """``"future"`` (beyond max_future), ``"old"`` (behind every window) or ``"normal"``."""
    if ts > NOW_MS + MAX_FUTURE_MS:  # (librdkafka writes a timestamp of 0 as its now)
        return "future"
    if ts in TOO_OLD_MS:
        return "old"
    return "normal"


# -- strategies ------------------------------------------------------------------------------

orders_values = st.builds(
    Order,
    id=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    amount=st.floats(allow_nan=False, allow_infinity=False),
    customer=st.sampled_from(CUSTOMERS),
)


def _valid() -> st.SearchStrategy[tuple[bytes, str]]:
    return orders_values.map(lambda o: (msgspec.json.encode(o), "valid"))


def _extra_field() -> st.SearchStrategy[tuple[bytes, str]]:
    # Unknown fields are ignored by a typed reader: still a valid record.
    return orders_values.map(
        lambda o: (msgspec.json.encode({**msgspec.structs.asdict(o), "extra": [1, {}]}), "extra")
    )


def _malformed() -> st.SearchStrategy[tuple[bytes, str]]:
    return st.one_of(
        st.binary(max_size=64).map(lambda b: (b, "binary")),
        st.just((b"", "empty")),
        st.just((b"not json", "text")),
        orders_values.flatmap(
            lambda o: st.integers(1, len(msgspec.json.encode(o)) - 1).map(
                lambda n: (msgspec.json.encode(o)[:n], "truncated")
            )
        ),
        st.integers(200, 50_000).map(lambda n: (b"[" * n + b"]" * n, f"nested {n}")),
        st.integers(200, 50_000).map(lambda n: (b'{"a":' * n + b"1" + b"}" * n, f"nested {n}")),
        st.just((b'{"id": 1, "amount": NaN, "customer": "c0"}', "NaN")),
        st.just((b'{"id": 1, "amount": Infinity, "customer": "c0"}', "Infinity")),
        st.just((b'{"id": 1' + b"0" * 400 + b', "amount": 1.0, "customer": "c0"}', "huge int")),
        st.just((b'{"id": 1, "amount": 1e999, "customer": "c0"}', "huge float")),
        st.just((b'{"id": "1", "amount": 1.0, "customer": "c0"}', "wrong type")),
        st.just((b'{"id": 1, "amount": 1.0, "customer": 7}', "wrong type")),
        st.just((b'{"id": 1, "customer": "c0"}', "missing field")),
        st.just((b'[1, 2.0, "c0"]', "array")),
        st.just((b"null", "json null")),
        st.just(
            (
                '{"id": 1, "amount": 1.0, "customer": "\ud800"}'.encode(errors="surrogatepass"),
                "bad utf-8",
            )
        ),
        st.just((json.dumps({"id": 2**64, "amount": 1.0, "customer": "c0"}).encode(), "int > i64")),
    )


values = st.one_of(
    _valid(),
    _valid(),
    _extra_field(),
    _malformed(),
    st.just((None, "tombstone")),
    st.just((b"\x00" * NEAR_LIMIT, "near the limit")),
)

keys = st.one_of(
    st.none(),
    st.sampled_from([c.encode() for c in CUSTOMERS]),
    st.just(b""),
    st.just(b"\xff\xfe\x00"),  # not UTF-8
    st.binary(max_size=16),
    st.just("é名".encode() * 4),
    st.just(b"k" * 16_384),
)

header_names = st.one_of(
    st.sampled_from(["trace", "x", "", "é名", "flowkit.agent", "trace"]),
    st.text(max_size=8),
)
header_values = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(max_size=8),
    st.just(b"v" * 16_384),
)
headers = st.one_of(
    st.just(()),
    st.lists(st.tuples(header_names, header_values), max_size=6).map(tuple),
    st.tuples(st.just("many"), st.none()).map(lambda h: (h,) * 200),
)

timestamps = st.one_of(
    st.integers(NOW_MS - 20_000, NOW_MS),
    st.integers(NOW_MS - 20_000, NOW_MS),
    st.integers(NOW_MS - 20_000, NOW_MS),
    st.sampled_from([*TOO_OLD_MS, FAR_FUTURE_MS]),
)


@st.composite
def envelopes(draw: st.DrawFn) -> Envelope:
    """One hostile (or valid) envelope for the ``orders`` or ``refunds`` topic."""
    value, note = draw(values)
    head = draw(headers)
    if value is not None and len(value) >= NEAR_LIMIT:
        head = ()  # the record itself must fit the producer's limit
    return Envelope(
        topic=draw(st.sampled_from(["orders", "orders", "refunds"])),
        key=draw(keys) if value is None or len(value) < NEAR_LIMIT else None,
        value=value,
        headers=head,
        timestamp_ms=draw(timestamps),
        note=note,
    )
