"""Applying changelog records to a table's store: the fast path (the codecs' own C
decoders) and the fallback that names a bad record; the bounded key -> partition cache."""

from __future__ import annotations

from typing import Any

import pytest

import flowkit
from flowkit.codecs import DecodeError
from flowkit.partitioning import partition_for_key
from flowkit.records import Message
from flowkit.state import base


def _records(*pairs: tuple[bytes | None, bytes | None]) -> list[Message]:
    return [Message("c", 0, i, 0, k, v) for i, (k, v) in enumerate(pairs)]


def _store(**table: Any) -> Any:
    app = flowkit.App("shop", partitions=1)
    store = app.table("totals", **table).new_store(now_ms=lambda: 0)
    store.assign([0])
    return store


@pytest.mark.parametrize("value_type", [int, Any])
def test_changelog_records_set_and_delete_keys(value_type: Any) -> None:
    store = _store(value_type=value_type)
    store.apply_changelog(
        0, _records((b"a", b"1"), (b"b", b"2"), (None, b"9"), (b"a", None), (b"b", b"3"))
    )
    assert dict(store.items()) == {"b": 3}


def test_a_bad_changelog_record_is_refused_and_the_others_applied() -> None:
    # Refused records are the worker's to dead-letter; the key keeps the value it had.
    store = _store(value_type=int)
    store.apply_changelog(0, _records((b"a", b"1"), (b"b", b'"two"'), (b"c", b"3")))
    assert dict(store.items()) == {"a": 1, "c": 3}
    ((message, error),) = store.rejected
    assert message.key == b"b" and isinstance(error, DecodeError)


def test_a_codec_without_a_raw_decoder_takes_the_plain_path() -> None:
    store = _store(key_type=bytes, value_type=int)  # raw keys: no raw_decode
    store.apply_changelog(0, _records((b"a", b"1"), (b"\xff", b"2"), (b"a", None)))
    assert dict(store.items()) == {b"\xff": 2}


def test_the_key_partition_cache_is_bounded_and_stays_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base, "_KEY_CACHE", 10)
    table = flowkit.App("shop", partitions=8).table("totals")
    for i in range(50):
        key = f"user-{i}"
        assert table.partition_of(key) == partition_for_key(key.encode(), 8)
    assert len(table._key_partition) <= 10
