"""Filters: every operator, missing fields, specs, and compiled == a naive reference."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.errors import ConfigurationError
from flowkit.routing.filters import Filter, all_of, any_of, field
from flowkit.testing import TestDriver

RECORD: dict[str, Any] = {
    "user": {"age": 30, "name": "Ada Lovelace", "tags": ["admin", "beta"], "email": None},
    "country": "NL",
    "flags": {"beta": True, "legacy": False, "score": 1},
    "items": [{"sku": "AB-1", "qty": 2}, {"sku": "CD-2", "qty": 0}],
    "amount": 12.5,
}


# --- operators -------------------------------------------------------------------------------

CASES: list[tuple[Filter, bool]] = [
    (field("user.age") == 30, True),
    (field("user.age") == 31, False),
    (field("user.age") != 31, True),
    (field("user.age") != 30, False),
    (field("user.age") < 31, True),
    (field("user.age") < 30, False),
    (field("user.age") <= 30, True),
    (field("user.age") > 29, True),
    (field("user.age") > 30, False),
    (field("user.age") >= 30, True),
    (field("amount") > 12, True),
    (field("country") == "NL", True),
    (field("country") > "AA", True),
    (field("country").in_(["DE", "NL"]), True),
    (field("country").in_({"DE"}), False),
    (field("items[0]").in_([{"sku": "AB-1", "qty": 2}]), True),  # unhashable members
    (field("user.name").startswith("Ada"), True),
    (field("user.name").startswith(["x", "Ad"]), True),
    (field("user.name").endswith("lace"), True),
    (field("user.name").endswith(("x", "y")), False),
    (field("user.name").contains("Love"), True),
    (field("user.tags").contains("beta"), True),
    (field("user.tags").contains("gamma"), False),
    (field("flags").contains("beta"), True),
    (field("flags.beta").is_true(), True),
    (field("flags.legacy").is_false(), True),
    (field("flags.score").is_true(), False),  # truthy is not true
    (field("flags.legacy").is_true(), False),
    (field("user.email").is_null(), True),
    (field("user.email").exists(), True),  # present, even if null
    (field("user.phone").exists(), False),
    (field("items[1].qty") == 0, True),
    (field("items[-1].sku") == "CD-2", True),
    (field("items[2].sku").exists(), False),
    (field(["user", "age"]) == 30, True),
]


@pytest.mark.parametrize(("f", "expected"), CASES, ids=[repr(f) for f, _ in CASES])
def test_operator(f: Filter, expected: bool) -> None:
    assert f(RECORD) is expected
    assert f.func(RECORD) is expected
    assert Filter.from_spec(f.to_spec())(RECORD) is expected


ALL_OPS = [
    field("x.y") == 1,
    field("x.y") != 1,
    field("x.y") < 1,
    field("x.y") <= 1,
    field("x.y") > 1,
    field("x.y") >= 1,
    field("x.y").in_([1, None]),
    field("x.y").contains(1),
    field("x.y").startswith("a"),
    field("x.y").endswith("a"),
    field("x.y").exists(),
    field("x.y").is_true(),
    field("x.y").is_false(),
    field("x.y").is_null(),
]


@pytest.mark.parametrize("f", ALL_OPS, ids=repr)
@pytest.mark.parametrize(
    "value",
    [{}, {"x": {}}, {"x": None}, {"x": [1]}, {"x": "str"}, {"z": 1}, [], None, 42, "x"],
    ids=repr,
)
def test_a_missing_field_makes_every_op_false_and_never_raises(f: Filter, value: Any) -> None:
    assert f(value) is False
    assert (~f)(value) is True


@pytest.mark.parametrize(
    ("f", "value"),
    [
        (field("a") > 18, {"a": "abc"}),
        (field("a") > 18, {"a": None}),
        (field("a") < "b", {"a": 3}),
        (field("a").startswith("x"), {"a": 3}),
        (field("a").startswith("x"), {"a": b"xyz"}),
        (field("a").contains("x"), {"a": 3}),
        (field("a").contains([1]), {"a": {"k": 1}}),
        (field("a").in_([1, 2]), {"a": [1]}),
        (field("a.b") == 1, {"a": [1]}),
        (field("a[0]") == 1, {"a": {"0": 1}}),
    ],
)
def test_a_value_of_the_wrong_type_makes_a_condition_false(f: Filter, value: Any) -> None:
    assert f(value) is False


def test_strings_can_be_indexed_like_lists() -> None:
    assert (field("code[0]") == "N")({"code": "NL"})


# --- combinators -----------------------------------------------------------------------------


def test_and_or_not() -> None:
    adult = field("user.age") >= 18
    dutch = field("country") == "NL"
    beta = field("flags.beta").is_true()
    assert (adult & dutch & beta)(RECORD)
    assert not (adult & ~dutch)(RECORD)
    assert (~adult | dutch)(RECORD)
    assert not (~adult | ~dutch)(RECORD)
    assert all_of(adult, dutch)(RECORD) and any_of(~adult, dutch)(RECORD)
    assert all_of()(RECORD) is True and any_of()(RECORD) is False


def test_combinators_flatten_and_double_negation_cancels() -> None:
    a, b, c = field("a") == 1, field("b") == 2, field("c") == 3
    assert (a & b & c).to_spec() == all_of(a, b, c).to_spec()
    assert (a | b | c).to_spec() == any_of(a, b, c).to_spec()
    assert (~~a).to_spec() == a.to_spec()


def test_a_missing_field_inside_or_and_not_follows_the_reference() -> None:
    f = (field("a") == 1) | (field("b.c") == 2)
    assert f({"b": {"c": 2}}) and f({"a": 1}) and not f({})
    g = ~(field("a") > 1) & field("b").exists()
    assert g({"b": 0}) and not g({"a": 2, "b": 0}) and not g({"a": 0})


def test_a_filter_has_no_truth_value() -> None:
    a = field("a") == 1
    with pytest.raises(TypeError, match="combine filters with &"):
        bool(a)
    with pytest.raises(TypeError, match="combine filters"):
        _ = 1 < field("a") < 3  # a chained comparison would silently drop a condition


def test_combining_with_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _ = (field("a") == 1) & (lambda v: True)


def test_repr_reads_like_the_code() -> None:
    f = ((field("a") > 1) & ~field("b").exists()) | field("c[0]").in_(["x"])
    assert repr(f) == "((field('a') > 1) & ~field('b').exists()) | field('c[0]').in_(['x'])"
    assert repr(~(field("a") == 1)) == "~(field('a') == 1)"
    assert repr(all_of()) == "all_of()" and repr(any_of(field("a").is_null())) == (
        "any_of(field('a').is_null())"
    )
    assert repr(field(["a.b"]) == 1) == "field(['a.b']) == 1"


def test_pickle_round_trip() -> None:
    f = (field("user.age") > 18) & field("country").in_(["NL"])
    g = pickle.loads(pickle.dumps(f))
    assert g(RECORD) and g.to_spec() == f.to_spec()


# --- objects ---------------------------------------------------------------------------------


class User(msgspec.Struct):
    age: int
    tags: list[str]


class Event(msgspec.Struct):
    user: User
    country: str
    meta: dict[str, Any]


def test_structs_are_read_by_attribute() -> None:
    event = Event(User(30, ["a"]), "NL", {"k": {"v": 1}})
    assert ((field("user.age") > 18) & (field("country") == "NL"))(event)
    assert field("user.tags[0]").startswith("a")(event)
    assert (field("meta.k.v") == 1)(event)
    assert not field("user.missing").exists()(event)
    assert not field("__class__").exists()(event)
    assert (~field("meta.k.w").exists() | (field("x") == 1))(event)


# --- specs -----------------------------------------------------------------------------------


def test_spec_round_trip_and_aliases() -> None:
    spec = {
        "and": [
            {"field": "user.age", "op": "gt", "value": 18},
            {"or": [{"field": "country", "op": "in", "value": ["NL", "BE"]}, True]},
            {"not": {"field": "x", "op": "exists"}},
            {"field": ["odd.key", 0], "op": "startswith", "value": ["a", "b"]},
        ]
    }
    f = Filter.from_spec(spec)
    assert f({"user": {"age": 20}, "country": "DE", "odd.key": ["b"]})
    back = f.to_spec()
    assert back["and"][0] == {"field": "user.age", "op": ">", "value": 18}
    assert back["and"][1]["or"][1] == {"and": []}
    assert back["and"][3] == {"field": ["odd.key", 0], "op": "startswith", "value": ["a", "b"]}
    assert Filter.from_spec(back).to_spec() == back
    assert Filter.from_spec(False)({}) is False


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "filter: expected an object, got list"),
        ({}, "filter: expected a key 'field', 'and', 'or' or 'not'"),
        ({"and": {"field": "a"}}, "filter.and: expected a list of conditions"),
        ({"and": [{"field": "a", "op": "exists"}], "or": []}, "filter: unexpected key 'or'"),
        ({"or": [{"field": "a"}]}, r"filter.or\[0\]: missing 'op'"),
        ({"not": {"field": "a", "op": "=>", "value": 1}}, "filter.not: unknown op '=>'; use one"),
        ({"field": "a", "op": "==", "value": 1, "vlaue": 2}, "filter: unexpected key 'vlaue'"),
        ({"field": "a", "op": "exists", "value": 1}, "op 'exists' takes no 'value'"),
        ({"field": "a", "op": ">"}, "filter: op '>' needs a 'value'"),
        ({"field": "a", "op": ">", "value": None}, "compares with a number or a string"),
        ({"field": "a", "op": "<", "value": True}, "compares with a number or a string"),
        ({"field": "a", "op": "<", "value": [1]}, "compares with a number or a string"),
        ({"field": "a", "op": "in", "value": "NL"}, "op 'in' needs a list of values"),
        ({"field": "a", "op": "in", "value": 3}, "op 'in' needs a list of values"),
        ({"field": "a", "op": "startswith", "value": 3}, "needs a string or a list of strings"),
        ({"field": "a", "op": "endswith", "value": []}, "needs a string or a list of strings"),
        ({"field": "a..b", "op": "exists"}, "filter: bad field path 'a..b': empty name"),
        ({"field": 3, "op": "exists"}, "filter: bad field path 3"),
        (
            {"and": [{"or": [{"field": "a", "op": "is_true"}, {"field": "b", "op": "~"}]}]},
            r"filter.and\[0\].or\[1\]: unknown op '~'",
        ),
    ],
)
def test_bad_specs_name_the_problem_and_where(spec: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        Filter.from_spec(spec)
    assert "\n" not in str(info.value)


def test_python_api_checks_values_too() -> None:
    with pytest.raises(ConfigurationError, match="compares with a number or a string"):
        _ = field("a") > None
    with pytest.raises(ConfigurationError, match="needs a list"):
        field("a").in_("NL")


# --- generated code --------------------------------------------------------------------------


def test_user_data_never_becomes_source() -> None:
    evil = "'] or __import__('os').system('echo pwned') or v['"
    f = (field([evil]) == evil) & field("x").startswith(evil)
    assert f({evil: evil, "x": evil + "!"})
    assert not f({"x": 1})


def test_filters_of_one_shape_share_their_code() -> None:
    a = (field("a.b") > 1) & (field("c") == "x")
    b = (field("p.q") > 9.5) & (field("r") == "y")
    assert a.func.__code__.co_code == b.func.__code__.co_code
    assert a.func.__code__.co_consts != b.func.__code__.co_consts


def test_very_deep_filters_fall_back_to_the_interpreter() -> None:
    f = field("a") == 1
    for i in range(300):
        f = (f | (field("b") == i)) if i % 2 else (f & ~(field("c") == i))
    assert f.func.__name__ == "interpreted"
    assert isinstance(f({"a": 1, "b": 299}), bool)


# --- compiled == a naive reference -----------------------------------------------------------

_MISS = object()


def naive_get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        if isinstance(value, dict):
            if key not in value:
                return _MISS
            value = value[key]
        elif isinstance(value, list | str) and isinstance(key, int):
            if not -len(value) <= key < len(value):
                return _MISS
            value = value[key]
        else:
            return _MISS
    return value


def naive_test(op: str, x: Any, c: Any) -> bool:
    if op == "exists":
        return True
    if op in ("is_true", "is_false", "is_null"):
        return x is {"is_true": True, "is_false": False, "is_null": None}[op]
    if op in ("startswith", "endswith"):
        return isinstance(x, str) and bool(getattr(x, op)(c))
    if op == "contains":
        if isinstance(x, str):
            return isinstance(c, str) and c in x
        if isinstance(x, dict):
            return not isinstance(c, list | dict) and c in x
        return isinstance(x, list) and c in x
    if op == "in":
        return any(x == item for item in c)
    if op in ("==", "!="):
        return (x == c) is (op == "==")
    try:
        return bool({"<": x < c, "<=": x <= c, ">": x > c, ">=": x >= c}[op])
    except TypeError:
        return False


def naive(spec: Any, value: Any) -> bool:
    if isinstance(spec, bool):
        return spec
    if "and" in spec:
        return all(naive(s, value) for s in spec["and"])
    if "or" in spec:
        return any(naive(s, value) for s in spec["or"])
    if "not" in spec:
        return not naive(spec["not"], value)
    x = naive_get(value, tuple(spec["field"]))
    return x is not _MISS and naive_test(spec["op"], x, spec.get("value"))


KEYS = st.sampled_from(["a", "b", "c"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-3, 3, allow_nan=False),
    st.sampled_from(["", "a", "ab", "b", "ba"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=12,
)
PATHS = st.lists(st.one_of(KEYS, st.sampled_from([0, 1, -1])), min_size=1, max_size=3)
ORDERED = st.one_of(st.integers(-3, 3), st.sampled_from(["", "a", "b"]))
STRS = st.sampled_from(["", "a", "b", "ab"])


def conditions() -> st.SearchStrategy[dict[str, Any]]:
    def cond(path: list[Any], op_value: tuple[str, Any]) -> dict[str, Any]:
        op, value = op_value
        spec = {"field": path, "op": op}
        return (
            spec if op in ("exists", "is_true", "is_false", "is_null") else spec | {"value": value}
        )

    op_values = st.one_of(
        st.tuples(st.sampled_from(["==", "!="]), JSON),
        st.tuples(st.sampled_from(["<", "<=", ">", ">="]), ORDERED),
        st.tuples(st.just("in"), st.lists(SCALARS, max_size=3)),
        st.tuples(st.just("contains"), SCALARS),
        st.tuples(st.sampled_from(["startswith", "endswith"]), STRS),
        st.tuples(st.sampled_from(["exists", "is_true", "is_false", "is_null"]), st.none()),
    )
    return st.builds(cond, PATHS, op_values)


FILTER_SPECS = st.recursive(
    st.one_of(conditions(), st.booleans()),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"and": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"or": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda x: {"not": x}, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None)
@given(FILTER_SPECS, st.lists(JSON, min_size=1, max_size=6))
def test_compiled_filter_matches_a_naive_reference(spec: Any, values: list[Any]) -> None:
    f = Filter.from_spec(spec)
    again = Filter.from_spec(f.to_spec())
    for value in values:
        expected = naive(spec, value)
        assert f(value) is expected, (spec, value)
        assert again(value) is expected


# --- in a stream -----------------------------------------------------------------------------


async def test_a_filter_works_in_stream_filter() -> None:
    app = flowkit.App("filters")
    events: flowkit.Topic[Any] = app.topic("events")
    out: flowkit.Topic[Any] = app.topic("out")
    keep = (field("user.age") >= 18) & ~field("test").is_true()

    @app.agent(events, sink=[out])
    async def route(stream: flowkit.Stream[Any]) -> AsyncIterator[Any]:
        async for event in stream.filter(keep):
            yield event["user"]["name"]

    async with TestDriver(app) as driver:
        for i, age in enumerate([12, 30, 45]):
            await driver.send(events, {"user": {"name": f"u{i}", "age": age}})
        await driver.send(events, {"user": {"name": "t", "age": 50}, "test": True})
        await driver.send(events, {"nobody": 1})
        await driver.run_until_idle()
        assert sorted(await driver.values(out)) == ["u1", "u2"]
        assert await driver.dead_letters() == []


def test_filter_is_built_from_the_helpers_only() -> None:
    with pytest.raises(TypeError, match="build filters with field"):
        Filter(lambda v: True)  # type: ignore[arg-type]
