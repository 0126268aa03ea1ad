"""A stream operator called wrongly in an agent's body stops the worker with one line.

The mistake is the code's, not a record's: the operator refuses its argument when it is
called (a ``DefinitionError`` naming the operator and the argument), and the worker stops
with it, once. Not an agent started again every few seconds for ever, and not every record
dead-lettered with an ``AttributeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flowkit
from flowkit.streams import StreamSource
from flowkit.testing import TestDriver

App = flowkit.App
Topic = flowkit.Topic


def declare(body: Callable[[Any, Topic[int]], Any]) -> tuple[App, Topic[int], list[int]]:
    """An app whose agent runs ``body(stream, evens)``; the list counts its starts."""
    app = flowkit.App("mistakes")
    numbers = app.topic("numbers", value_type=int)
    evens = app.topic("evens", value_type=int)
    starts: list[int] = []

    @app.agent(numbers)
    async def agent(stream: flowkit.Stream[int]) -> None:
        starts.append(1)
        await body(stream, evens)

    return app, numbers, starts


async def loop(values: Any) -> None:
    async for _ in values:
        pass


MISTAKES: list[tuple[str, Callable[[Any, Topic[int]], Any], str]] = [
    (
        "echo a name",
        lambda s, evens: loop(s.echo("evens")),
        r"stream.echo\(\) takes topics declared with app.topic\(\), not str 'evens'",
    ),
    ("echo nothing", lambda s, evens: loop(s.echo()), r"stream.echo\(\) takes one or more topics"),
    (
        "echo before take",
        lambda s, evens: loop(s.echo(evens).take(2)),
        r"stream.echo\(\) cannot come before take\(\)",
    ),
    (
        "echo before batches",
        lambda s, evens: loop(s.echo(evens).batches(2, 1)),
        r"stream.echo\(\) cannot come before batches\(\)",
    ),
    (
        "take 0",
        lambda s, evens: loop(s.take(0)),
        r"stream.take\(\): max_ must be an int >= 1, not int 0",
    ),
    (
        "take a str",
        lambda s, evens: loop(s.take("5")),
        r"stream.take\(\): max_ must be an int >= 1, not str '5'",
    ),
    (
        "take within -1",
        lambda s, evens: loop(s.take(2, within=-1)),
        r"stream.take\(\): within must be >= 0 seconds",
    ),
    (
        "batches 0",
        lambda s, evens: loop(s.batches(0, 1)),
        r"stream.batches\(\): max_size must be an int >= 1, not int 0",
    ),
    (
        "batches within",
        lambda s, evens: loop(s.batches(2, "1")),
        r"stream.batches\(\): within_seconds must be seconds",
    ),
    (
        "filter 42",
        lambda s, evens: loop(s.filter(42)),
        r"stream.filter\(\): predicate must be a function, not int 42",
    ),
    (
        "map a str",
        lambda s, evens: loop(s.map("upper")),
        r"stream.map\(\): fn must be a function, not str 'upper'",
    ),
    (
        "group_by without name",
        lambda s, evens: loop(s.group_by(abs)),
        r"stream.group_by\(\) needs name=",
    ),
    (
        "group_by key",
        lambda s, evens: loop(s.group_by(5, name="g")),
        r"stream.group_by\(\): key must be a function, not int 5",
    ),
    (
        "through 5",
        lambda s, evens: loop(s.through(5)),
        r"stream.through\(\) takes a topic or a topic name, not int 5",
    ),
    (
        "join a topic",
        lambda s, evens: loop(s.join(evens, on=abs)),
        r"stream.join\(\) joins a table",
    ),
    (
        "join missing",
        lambda s, evens: loop(s.join({}, on=abs, missing="drop")),
        r"stream.join\(\): missing must be 'skip', 'none' or 'error', not str 'drop'",
    ),
    (
        "join on",
        lambda s, evens: loop(s.join({}, on=5)),
        r"stream.join\(\): on must be a function or a field name, not int 5",
    ),
    (
        "join on field",
        lambda s, evens: loop(s.join({}, on="ad-id")),
        r"stream.join\(\): on='ad-id' is not a field name",
    ),
    (
        "enumerate",
        lambda s, evens: loop(s.enumerate("1")),
        r"stream.enumerate\(\): start must be an int, not str '1'",
    ),
]


@pytest.mark.parametrize(
    ("body", "message"), [(b, m) for _, b, m in MISTAKES], ids=[i for i, _, _ in MISTAKES]
)
async def test_an_operator_called_wrongly_stops_the_worker_once(body: Any, message: str) -> None:
    app, numbers, starts = declare(body)
    async with TestDriver(app) as driver:
        await driver.send(numbers, 2)
        with pytest.raises(flowkit.DefinitionError, match=f"^agent 'agent': {message}") as info:
            await driver.run_until_idle(timeout=10)
        assert "\n" not in str(info.value)
        assert driver.worker.stopping
    assert starts == [1]  # started once: not again every few seconds
    assert await driver.dead_letters() == []  # and no record paid for the mistake


@pytest.mark.parametrize(
    ("body", "message"), [(b, m) for _, b, m in MISTAKES], ids=[i for i, _, _ in MISTAKES]
)
async def test_the_operator_refuses_its_argument_when_called(body: Any, message: str) -> None:
    # Outside a worker too: the call itself raises, before any record is read.
    stream: flowkit.Stream[int] = flowkit.Stream(StreamSource("s"))
    evens = flowkit.App("x").topic("evens", value_type=int)
    with pytest.raises(flowkit.DefinitionError, match=f"^{message}"):
        await body(stream, evens)


async def test_a_mistake_in_a_per_record_agent_stops_the_worker_too() -> None:
    app = flowkit.App("per-record-mistake")
    numbers = app.topic("numbers", value_type=int)
    calls: list[int] = []

    @app.agent(numbers, per_record=True)
    def handle(n: int) -> None:
        calls.append(n)
        flowkit.Retry(attempts=0)  # a declaration, made per record

    async with TestDriver(app) as driver:
        await driver.send(numbers, 1)
        await driver.send(numbers, 2)
        with pytest.raises(
            flowkit.DefinitionError, match=r"^agent 'handle': Retry\(attempts=\) must be"
        ):
            await driver.run_until_idle(timeout=10)
    assert calls == [1]
    assert await driver.dead_letters() == []


@pytest.mark.parametrize(
    ("use", "message"),
    [
        (lambda s, t: loop(s.echo(t)), r"stream.echo\(\) does not work on a join's stream"),
        (lambda s, t: loop(s.take(2)), r"stream.take\(\) does not work on a join's stream"),
        (lambda s, t: loop(s.batches(2, 1)), r"stream.batches\(\) does not work on a join"),
    ],
    ids=["echo", "take", "batches"],
)
async def test_operators_a_join_stream_cannot_run_are_refused_when_called(
    use: Any, message: str
) -> None:
    app = flowkit.App("join-mistakes")
    left = app.topic("left", value_type=int)
    right = app.topic("right", value_type=int)
    copies = app.topic("copies", value_type=Any)
    both = app.join(left, right, within=5, name="both")

    @app.agent(both)
    async def agent(stream: flowkit.Stream[flowkit.Joined]) -> None:
        await use(stream, copies)

    async with TestDriver(app) as driver:
        await driver.send(left, 1, key="k")
        await driver.send(right, 2, key="k")
        with pytest.raises(flowkit.DefinitionError, match=f"^agent 'agent': {message}"):
            await driver.run_until_idle(timeout=10)
    assert await driver.dead_letters() == []


NOT_A_SIZE = st.one_of(
    st.integers(max_value=0), st.floats(), st.text(), st.booleans(), st.none(), st.binary()
)


@given(NOT_A_SIZE)
def test_any_list_size_but_a_positive_int_is_refused_in_one_line(size: Any) -> None:
    stream: flowkit.Stream[int] = flowkit.Stream(StreamSource("s"))
    for call, name in (
        (stream.take, r"take\(\): max_"),
        (stream.batches, r"batches\(\): max_size"),
    ):
        with pytest.raises(
            flowkit.DefinitionError, match=rf"^stream.{name} must be an int >= 1, not "
        ) as info:
            call(size, 1)
        assert "\n" not in str(info.value)
