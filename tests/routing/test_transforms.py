"""Transforms: each step, errors, specs, fusion, and compiled == the reference steps."""

from __future__ import annotations

import copy
import dis
import hashlib
import pickle
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.errors import ConfigurationError, MissingFieldError, ProcessingError
from flowkit.routing.transforms import (
    Transform,
    build,
    chain,
    drop,
    hash_field,
    literal,
    lower,
    pick,
    rename,
    strip,
    template,
    upper,
)
from flowkit.testing import TestDriver


def record() -> dict[str, Any]:
    return {
        "id": 7,
        "user": {"id": "u-1", "name": "  Ada  ", "email": "ADA@EXAMPLE.COM", "age": 36},
        "country": "nl",
        "items": [{"sku": "AB", "qty": 2}, {"sku": "CD", "qty": 1}],
        "bin": b"raw",
    }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check(t: Transform, value: Any) -> Any:
    """Run ``t`` through the generated code and the reference steps; both must agree and
    neither may touch the input."""
    before = copy.deepcopy(value)
    out = t(value)
    assert t.step.apply(value) == out
    assert value == before
    return out


# --- steps -----------------------------------------------------------------------------------


def test_pick_keeps_nesting_and_order() -> None:
    out = check(pick("country", "user.id", "id", "user.age"), record())
    assert out == {"country": "nl", "user": {"id": "u-1", "age": 36}, "id": 7}
    assert list(out) == ["country", "user", "id"]


def test_pick_a_shorter_path_wins() -> None:
    r = record()
    assert check(pick("user", "user.id"), r) == {"user": r["user"]}
    assert check(pick("user.id", "user"), r) == {"user": r["user"]}


def test_pick_missing_raises_or_skips() -> None:
    with pytest.raises(MissingFieldError, match=r"^pick: field 'user.phone' is missing$") as info:
        pick("id", "user.phone")(record())
    assert isinstance(info.value, KeyError) and info.value.path == ("user", "phone")
    assert check(pick("id", "user.phone", "nope.x", missing="skip"), record()) == {"id": 7}
    assert check(pick("user.phone", missing="skip"), record()) == {}


def test_missing_field_error_is_a_processing_error_and_a_key_error() -> None:
    with pytest.raises(ProcessingError) as info:
        rename({"a.b": "c"})({"a": {}})
    error = info.value
    assert isinstance(error, MissingFieldError) and isinstance(error, KeyError)
    assert error.stage == "process" and error.path == ("a", "b")
    assert flowkit.MissingFieldError is MissingFieldError
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) == "rename: field 'a.b' is missing"
    assert again.path == ("a", "b")


def test_pick_rejects_list_indexes_and_bad_options() -> None:
    with pytest.raises(ConfigurationError, match=r"output path 'items\[0\]' has a list index"):
        pick("items[0]")
    with pytest.raises(ConfigurationError, match=r"missing must be 'error' or 'skip'"):
        pick("a", missing="ignore")


def test_drop() -> None:
    out = check(drop("user.email", "bin", "nope", "user.x.y", "items[0]"), record())
    assert "email" not in out["user"] and "bin" not in out
    assert out["items"] == [{"sku": "CD", "qty": 1}]
    assert check(drop("items[5]"), record())["items"] == record()["items"]


def test_rename() -> None:
    out = check(rename({"user.email": "contact.email", "id": "event_id"}), record())
    assert out["contact"] == {"email": "ADA@EXAMPLE.COM"} and out["event_id"] == 7
    assert "email" not in out["user"] and "id" not in out
    with pytest.raises(MissingFieldError, match=r"rename: field 'nope' is missing"):
        rename({"nope": "x"})(record())


def test_build_from_paths_and_literals() -> None:
    t = build(
        {"who": "user.id", "sku": "items[-1].sku", "meta.v": literal(2), "meta.tags": literal([])}
    )
    out = check(t, record())
    assert out == {"who": "u-1", "sku": "CD", "meta": {"v": 2, "tags": []}}
    out["meta"]["tags"].append("x")
    assert t(record())["meta"]["tags"] == []  # container literals are not shared
    with pytest.raises(MissingFieldError, match=r"build: field 'user.phone' is missing"):
        build({"p": "user.phone"})(record())


def test_build_rejects_overlapping_outputs() -> None:
    with pytest.raises(ConfigurationError, match=r"output path 'a.b' overlaps another"):
        build({"a": "id", "a.b": "id"})


def test_hash_field() -> None:
    r = record()
    assert check(hash_field("user.id"), r)["user"]["id"] == sha256(b"u-1")
    assert check(hash_field("id"), r)["id"] == sha256(b"7")  # JSON text of a number
    assert check(hash_field("bin"), r)["bin"] == sha256(b"raw")
    assert check(hash_field("items[0]"), r)["items"][0] == sha256(b'{"sku":"AB","qty":2}')
    salted = check(hash_field("user.id", salt=b"pepper", algorithm="md5"), r)
    assert salted["user"]["id"] == hashlib.md5(b"pepperu-1").hexdigest()
    out = check(hash_field("user.email", to="user.email_hash"), r)
    assert out["user"]["email"] == "ADA@EXAMPLE.COM"
    assert out["user"]["email_hash"] == sha256(b"ADA@EXAMPLE.COM")
    assert check(hash_field("user.id", to="anon.uid"), r)["anon"] == {"uid": sha256(b"u-1")}


def test_hash_field_checks_its_settings() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown hash algorithm 'sha0'"):
        hash_field("a", algorithm="sha0")
    with pytest.raises(ConfigurationError, match=r"unknown hash algorithm 'shake_128'"):
        hash_field("a", algorithm="shake_128")
    with pytest.raises(ConfigurationError, match=r"salt must be text or bytes, not 3"):
        hash_field("a", salt=3)  # type: ignore[arg-type]
    assert hash_field("a", salt="s")({"a": "x"}) == hash_field("a", salt=b"s")({"a": "x"})


def test_hash_field_type_errors_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"hash: field 'x' is of type object"):
        hash_field("x")({"x": object()})


def test_string_ops() -> None:
    r = record()
    assert check(lower("user.email"), r)["user"]["email"] == "ada@example.com"
    assert check(upper("country"), r)["country"] == "NL"
    assert check(strip("user.name"), r)["user"]["name"] == "Ada"
    assert check(upper("items[1].sku", to="top"), r)["top"] == "CD"
    with pytest.raises(TypeError, match=r"^upper: field 'id' is of type int$"):
        upper("id")(r)
    with pytest.raises(TypeError, match=r"lower: field 'bin' is of type bytes"):
        lower("bin")(r)
    with pytest.raises(MissingFieldError, match=r"strip: field 'user.nick' is missing"):
        strip("user.nick")(r)


def test_template() -> None:
    r = record()
    out = check(template("{user.id}/{items[0].qty:03d}/{country!r}/{{x}}", to="key"), r)
    assert out["key"] == "u-1/002/'nl'/{x}"
    with pytest.raises(MissingFieldError, match=r"template: field 'nope' is missing"):
        template("{nope}", to="k")(r)


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("{}", "name a field in every"),
        ("{0}", "name a field in every"),
        ("{a:{w}}", "nested"),
        ("{a", "expected '}'"),
        ("{a..b}", "bad field path"),
    ],
)
def test_bad_templates(fmt: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        template(fmt, to="k")


def test_writing_through_a_non_dict_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"cannot set 'id.x': 'id' is of type int"):
        lower("country", to="id.x")(record())
    with pytest.raises(TypeError, match=r"cannot set 'x': the record is of type list"):
        lower("[0]", to="x")(["A"])
    with pytest.raises(MissingFieldError, match=r"'items\[9\]' is missing"):
        lower("country", to="items[9]")(record())


def test_chain_fuses_and_flattens() -> None:
    t = chain(
        chain(pick("id", "user.id", "user.email"), hash_field("user.id")), lower("user.email")
    )
    assert (
        repr(t)
        == "chain(pick('id', 'user.id', 'user.email'), hash_field('user.id'), lower('user.email'))"
    )
    out = check(t, record())
    assert out == {"id": 7, "user": {"id": sha256(b"u-1"), "email": "ada@example.com"}}
    # after a pick, the hash and the lowercase run inside its dict display: no dict copies
    assert "DICT_UPDATE" not in {i.opname for i in dis.get_instructions(t.func)}
    unfused = chain(pick("id", "user.id", "user.email"), drop("nope"), hash_field("user.id"))
    assert "DICT_UPDATE" in {i.opname for i in dis.get_instructions(unfused.func)}
    assert check(unfused, record())["user"]["id"] == out["user"]["id"]
    assert chain()(r := record()) is r


def test_chain_rerun_gives_the_precise_error() -> None:
    t = chain(rename({"uid": "user.id"}), hash_field("user.id"), pick("user.id", "n"))
    assert t({"uid": "a", "n": 1}) == {"user": {"id": sha256(b"a")}, "n": 1}
    with pytest.raises(MissingFieldError, match=r"pick: field 'n' is missing"):
        t({"uid": "a"})


def test_structs_can_be_read() -> None:
    class User(msgspec.Struct):
        id: str
        name: str

    class Event(msgspec.Struct):
        user: User
        n: int

    event = Event(User("u", "Ada"), 3)
    assert pick("user.id", "n")(event) == {"user": {"id": "u"}, "n": 3}
    assert build({"who": "user.name"})(event) == {"who": "Ada"}


def test_repr_and_pickle() -> None:
    t = chain(
        build({"a.b": "x", "c": literal(1)}),
        hash_field("a.b", algorithm="md5", salt=b"s", to="h"),
        template("{c}", to="t"),
        rename({"c": "d"}),
        drop("x"),
        pick("a", missing="skip"),
    )
    assert repr(t) == (
        "chain(build({'a.b': 'x', 'c': {'literal': 1}}), "
        "hash_field('a.b', algorithm='md5', salt=<hidden>, to='h'), "
        "template('{c}', to='t'), rename({'c': 'd'}), drop('x'), pick('a', missing='skip'))"
    )
    again = pickle.loads(pickle.dumps(t))
    assert again({"x": 5}) == t({"x": 5}) == {"a": {"b": 5}}


# --- specs -----------------------------------------------------------------------------------


def test_spec_round_trip() -> None:
    spec = [
        {"pick": ["id", "user.id", "user.email", "country"], "missing": "skip"},
        {"hash": "user.id", "algorithm": "sha1", "salt": "pepper", "to": "uid"},
        {"lower": "user.email"},
        {"upper": "country", "to": "cc"},
        {"strip": "user.email"},
        {"rename": {"user.email": "email"}},
        {"drop": ["user"]},
        {"template": "{cc}-{id}", "to": "key"},
        {"build": {"key": "key", "uid": "uid", "src": {"literal": "web"}}},
    ]
    t = Transform.from_spec(spec)
    out = t(record())
    assert out == {"key": "NL-7", "uid": hashlib.sha1(b"pepperu-1").hexdigest(), "src": "web"}
    assert Transform.from_spec(t.to_spec()).to_spec() == t.to_spec() == {"chain": spec}
    assert Transform.from_spec({"chain": spec})(record()) == out


def test_a_salt_of_any_bytes_round_trips_through_a_spec() -> None:
    t = hash_field("a", salt=b"\xff\x00")
    again = Transform.from_spec(t.to_spec())
    assert again({"a": "x"}) == t({"a": "x"}) == {"a": sha256(b"\xff\x00x")}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (3, "transform: expected an object or a list, got int"),
        ({}, "transform: expected exactly one of pick, drop"),
        ({"pick": ["a"], "drop": ["b"]}, "transform: expected exactly one of"),
        ({"pick": "a"}, "transform: pick: expected a list of field paths"),
        ({"pick": ["a"], "to": "b"}, "transform: unexpected key 'to' for 'pick'"),
        ({"pick": ["a.."]}, "transform: bad field path 'a..'"),
        ({"rename": ["a"]}, "transform: rename: expected an object"),
        ({"build": {"a": 3}}, "transform: build: 'a' needs a field path or a literal"),
        ({"hash": "a", "algorithm": "nope"}, "transform: unknown hash algorithm 'nope'"),
        ({"hash": "a", "salt": 3}, "transform: hash: salt must be text or bytes, not 3"),
        ({"template": "{a}"}, "transform: template: needs a format string and a 'to' path"),
        ({"chain": {"pick": ["a"]}}, "transform.chain: expected a list of transforms"),
        ([{"pick": ["a"]}, [{"lower": 3}]], r"transform\[1\]\[0\]: bad field path 3"),
    ],
)
def test_bad_specs_name_the_problem_and_where(spec: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        Transform.from_spec(spec)
    assert "\n" not in str(info.value)


# --- generated code == reference steps -------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c"])
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "x", "Y "])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=10,
)
NAME_PATHS = st.lists(KEYS, min_size=1, max_size=3).map(".".join)
ANY_PATHS = st.lists(st.one_of(KEYS, st.sampled_from([0, -1])), min_size=1, max_size=3)
STEPS = st.one_of(
    st.builds(
        lambda ps, m: pick(*ps, missing=m),
        st.lists(NAME_PATHS, min_size=1, max_size=3),
        st.sampled_from(["error", "skip"]),
    ),
    st.builds(lambda ps: drop(*ps), st.lists(ANY_PATHS, max_size=2)),
    st.builds(lambda a, b: rename({a: b}), NAME_PATHS, NAME_PATHS),
    st.builds(
        lambda d: build(dict(d)),
        st.dictionaries(st.sampled_from(["o", "p.q", "r"]), NAME_PATHS, min_size=1),
    ),
    st.builds(hash_field, ANY_PATHS, to=st.one_of(st.none(), NAME_PATHS)),
    st.builds(lambda p, f: f(p), ANY_PATHS, st.sampled_from([lower, upper, strip])),
    st.builds(lambda p, to: template("<{" + p + "}>", to=to), NAME_PATHS, NAME_PATHS),
)


def outcome(fn: Any, value: Any) -> Any:
    try:
        return ("ok", fn(value))
    except (KeyError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


@settings(max_examples=400, deadline=None)
@given(st.lists(STEPS, min_size=1, max_size=3), st.lists(JSON, min_size=1, max_size=4))
def test_generated_code_matches_the_reference_steps(
    steps: list[Transform], values: list[Any]
) -> None:
    t = chain(*steps)
    for value in values:
        before = copy.deepcopy(value)
        assert outcome(t, value) == outcome(t.step.apply, value)
        assert value == before  # never changes its input


# --- in a stream -----------------------------------------------------------------------------


async def test_a_transform_works_in_stream_map_and_bad_records_are_dead_lettered() -> None:
    app = flowkit.App("transforms")
    events: flowkit.Topic[Any] = app.topic("events")
    out: flowkit.Topic[Any] = app.topic("out")
    anonymise = chain(pick("id", "user.id"), hash_field("user.id"))

    @app.agent(events, sink=[out])
    async def route(stream: flowkit.Stream[Any]) -> AsyncIterator[Any]:
        async for event in stream.map(anonymise):
            yield event

    async with TestDriver(app) as driver:
        await driver.send(events, {"id": 1, "user": {"id": "a", "name": "x"}})
        await driver.send(events, {"id": 2})
        await driver.run_until_idle()
        assert await driver.values(out) == [{"id": 1, "user": {"id": sha256(b"a")}}]
        [dead] = await driver.dead_letters()
        headers = dict(dead.headers)
        assert headers["flowkit.error.type"] == b"MissingFieldError"
        assert headers["flowkit.error.message"] == b"pick: field 'user.id' is missing"


def test_transform_is_built_from_the_helpers_only() -> None:
    with pytest.raises(TypeError, match="build transforms with pick"):
        Transform(lambda v: v)  # type: ignore[arg-type]
