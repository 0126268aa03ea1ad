"""Field paths: parsing, reading back as text, and resolving into values."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowkit.errors import ConfigurationError
from flowkit.routing.paths import MISSING, parse_path, path_text, resolve

RECORD: dict[str, Any] = {
    "user": {"age": 30, "name": "Ada Lovelace", "tags": ["admin", "beta"], "email": None},
    "country": "NL",
    "items": [{"sku": "AB-1", "qty": 2}, {"sku": "CD-2", "qty": 0}],
}

# --- parse_path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("a", ("a",)),
        ("user.age", ("user", "age")),
        ("items[0].sku", ("items", 0, "sku")),
        ("m[1][-1]", ("m", 1, -1)),
        ("[2].x", (2, "x")),
        ("with space.ok", ("with space", "ok")),
        (["a.b", 0], ("a.b", 0)),
    ],
)
def test_parse_path(text: Any, path: tuple[Any, ...]) -> None:
    assert parse_path(text) == path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty name"),
        ("a..b", "empty name"),
        ("a.", "empty name"),
        ("a.[0]", "empty name"),
        ("a[x]", "use name[0] for a list index"),
        ("a[0", "use name[0]"),
        ("a]", "use name[0]"),
        ([], "need keys (str) and indexes (int)"),
        (["a", True], "need keys"),
        (["a", 1.5], "need keys"),
    ],
)
def test_bad_paths_say_what_is_wrong(text: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=r"bad field path .*" + re.escape(message)):
        parse_path(text)


def test_a_tuple_of_keys_is_taken_as_is() -> None:
    assert parse_path(("a", -1)) == ("a", -1)
    assert parse_path(["", "x[0]"]) == ("", "x[0]")  # no parsing inside a list's keys


def test_a_path_that_is_not_text_or_a_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="bad field path 3: need keys"):
        parse_path(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="need keys"):
        parse_path({"a": 1})  # type: ignore[arg-type]


# --- path_text -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (("a",), "a"),
        (("user", "age"), "user.age"),
        (("items", 0, "sku"), "items[0].sku"),
        (("m", 1, -1), "m[1][-1]"),
        ((2, "x"), "[2].x"),
        (("with space", "ok"), "with space.ok"),
        (("key.with.dots", 2), ["key.with.dots", 2]),
        (("a[0]",), ["a[0]"]),
        (("",), [""]),
        (("a", ""), ["a", ""]),
    ],
)
def test_path_text_is_text_only_when_it_reads_back_the_same(path: Any, text: Any) -> None:
    assert path_text(path) == text
    assert parse_path(text) == path


KEYS = st.one_of(
    st.text(alphabet="ab.[]0-", max_size=4),
    st.integers(-3, 3),
)


@given(st.lists(KEYS, min_size=1, max_size=4).map(tuple))
def test_path_text_round_trips_any_path(path: tuple[str | int, ...]) -> None:
    assert parse_path(path_text(path)) == path


# --- resolve ---------------------------------------------------------------------------------


def test_resolve_reads_dicts_lists_and_objects() -> None:
    class Obj:
        def __init__(self) -> None:
            self.inner = {"x": [1, 2]}
            self._private = 1

    assert resolve(RECORD, ("items", -1, "sku")) == "CD-2"
    assert resolve(RECORD, ("items", 5)) is MISSING
    assert resolve(RECORD, ("user", "items")) is MISSING  # never a dict's method
    assert resolve(RECORD, ("country", "upper")) is MISSING
    assert resolve(Obj(), ("inner", "x", 1)) == 2
    assert resolve(Obj(), ("_private",)) is MISSING
    assert resolve(Obj(), ("__class__",)) is MISSING


def test_resolve_misses_instead_of_raising() -> None:
    assert resolve(RECORD, ("user", "age", "x")) is MISSING  # into an int
    assert resolve(RECORD, ("country", 5)) is MISSING  # past the end of a string
    assert resolve(RECORD, ("items", "sku")) is MISSING  # a name into a list
    assert resolve(None, ("a",)) is MISSING
    assert resolve(RECORD, ("user", "email")) is None  # present and null: not a miss


def test_resolve_indexes_strings_and_reads_non_string_keys() -> None:
    assert resolve(RECORD, ("country", 0)) == "N"
    assert resolve(RECORD, ("country", -1)) == "L"
    assert resolve({1: {"x": True}}, (1, "x")) is True


def test_resolve_reads_structs_by_attribute() -> None:
    class User(msgspec.Struct):
        name: str
        tags: list[str]

    class Event(msgspec.Struct):
        user: User
        meta: dict[str, Any]

    event = Event(User("Ada", ["a", "b"]), {"k": {"v": 1}})
    assert resolve(event, ("user", "tags", -1)) == "b"
    assert resolve(event, ("meta", "k", "v")) == 1
    assert resolve(event, ("user", "missing")) is MISSING
    assert resolve(event, ("user", 0)) is MISSING
    assert resolve(event, ("__struct_fields__",)) is MISSING


def test_an_empty_path_is_the_value_itself() -> None:
    assert resolve(RECORD, ()) is RECORD
