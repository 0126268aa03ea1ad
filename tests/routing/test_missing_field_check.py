"""A failing pick/build names the same missing field with or without its quick check."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from flowkit.errors import MissingFieldError
from flowkit.routing import build, literal, pick


def outcome(apply: Any, value: Any) -> Any:
    try:
        return ("ok", apply(value))
    except MissingFieldError as exc:
        return ("missing", str(exc), exc.path)
    except Exception as exc:
        return (type(exc).__name__, str(exc))


RECORDS: list[Any] = [
    {"a": 1, "b": {"c": 2}, "d": {"e": {"f": 3}}},
    {"a": 1},
    {"b": {"c": 2}},
    {"a": 1, "b": {}, "d": {"e": {}}},
    {"a": 1, "b": {"c": 2}, "d": {"e": 5}},  # not a dict on the way
    {"a": 1, "b": [1], "d": {"e": {"f": 3}}},
    {"a": 1, "b": defaultdict(int), "d": {"e": {"f": 3}}},  # subscript makes the key
    {"a": None, "b": {"c": None}, "d": {"e": {"f": None}}},
    [],
    "text",
    defaultdict(dict),
]


@pytest.mark.parametrize(
    "transform",
    [
        pick("a", "b.c", "d.e.f"),
        pick("d.e.f", "a"),
        build({"x": "b.c", "y": literal("k"), "z": "d.e.f", "w": "a"}),
    ],
)
def test_the_quick_check_names_the_field_the_reference_would(transform: Any) -> None:
    shape = transform.step
    assert shape._missing_at is not None
    for record in RECORDS:
        quick = outcome(shape.apply, record)
        shape._missing_at = None  # the reference loop alone
        try:
            assert quick == outcome(shape.apply, record), record
        finally:
            shape.__setstate__({})


def test_no_quick_check_where_it_could_differ() -> None:
    assert build({"x": "a[0]"}).step._missing_at is None  # a list index
    assert build({"x": "a", "y": literal([1])}).step._missing_at is None  # a copied literal
    assert pick("a", missing="skip").step._missing_at is None
