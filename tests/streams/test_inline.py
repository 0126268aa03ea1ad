"""Which lambdas the compiled stream loop writes in as expressions, and which it calls."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from flowkit.streams._inline import NO_CONSTANT, inline_form, key_form

LIMIT = 3


def closure(k: int) -> Any:
    return lambda v: v.x == k


@pytest.mark.parametrize(
    ("fn", "form"),
    [
        (lambda v: v.event_type == "view", ("v.event_type == {c}", "view")),
        (lambda v: v.a.b, ("v.a.b", NO_CONSTANT)),
        (lambda v: v.n >= -1, ("v.n >= {c}", -1)),
        (lambda v: v.x in ("a", "b"), ("v.x in {c}", ("a", "b"))),
        (lambda v: v.x not in {"a"}, ("v.x not in {c}", frozenset({"a"}))),
        (lambda v: v.x is None, ("v.x is {c}", None)),
        (lambda v: v.x is not None, ("v.x is not {c}", None)),
    ],
)
def test_simple_lambdas_are_written_in(fn: Any, form: tuple[str, Any]) -> None:
    assert inline_form(fn) == form


@pytest.mark.parametrize(
    "fn",
    [
        lambda v: v.x == LIMIT,  # a global: read when called, so it is called
        closure(3),
        lambda v, w: v.x == 1,
        lambda v, *, k=1: v.x == 1,
        lambda *v: v,
        lambda v: v,
        lambda v: v.x.startswith("a"),
        lambda v: not v.x,
        lambda v: 1 == v.x,  # noqa: SIM300 - the operands' order is the point
        lambda v: v.x == 1 and v.y == 2,
        operator.attrgetter("x"),
        len,
    ],
)
def test_other_functions_are_called(fn: Any) -> None:
    assert inline_form(fn) is None


def test_a_join_key_of_attributes_is_written_in() -> None:
    assert key_form(operator.attrgetter("ad_id")) == "v.ad_id"
    assert key_form(operator.attrgetter("a.b")) == "v.a.b"
    assert key_form(lambda v: v.ad_id) == "v.ad_id"
    assert key_form(operator.attrgetter("a", "b")) is None
    assert key_form(lambda v: v.a == 1) is None
    assert key_form(lambda v: v["a"]) is None
