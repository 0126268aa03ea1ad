"""A wrong declaration is refused where it is made: one line naming the argument.

Each row declares one thing wrongly and names (a piece of) the line that must say so. The
line is a ``DefinitionError`` (or, for a codec, a ``ConfigurationError``): never a
Python error from inside flowkit, and never a declaration accepted that fails later.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flowkit
from flowkit.errors import ConfigurationError, DefinitionError


async def body(stream: Any) -> None:
    async for _ in stream:
        pass


async def tick() -> None:
    pass


class Declared:
    """An app with a topic, and ways to declare things on it."""

    def __init__(self) -> None:
        self.app = flowkit.App("decl")
        self.topic = self.app.topic("t", value_type=int)
        self.other = self.app.topic("o", value_type=int)

    def agent(self, *args: Any, **options: Any) -> Any:
        return self.app.agent(*(args or (self.topic,)), **options)(body)

    def join(self, **options: Any) -> Any:
        return self.app.join(self.topic, self.other, name=options.pop("name", "j"), **options)


class NotASink:
    def write_batch(self, items: list[Any]) -> None: ...


class BadOptions:
    def __init__(self, options: Any) -> None:
        self.runner_options = options

    async def write_batch(self, items: list[Any]) -> None: ...

    async def aclose(self) -> None: ...


Declare = Callable[[Declared], Any]

BAD: list[tuple[str, Declare, str]] = [
    # App
    ("app name", lambda d: flowkit.App(5), r"app name must be a str, not int 5"),
    ("app name chars", lambda d: flowkit.App("a b"), r"app name 'a b' may use only letters"),
    (
        "app partitions str",
        lambda d: flowkit.App("a", partitions="4"),
        r"App\(\): partitions must be an int >= 1, not str '4'",
    ),
    (
        "app partitions 0",
        lambda d: flowkit.App("a", partitions=0),
        r"partitions must be an int >= 1, not int 0",
    ),
    (
        "app partitions bool",
        lambda d: flowkit.App("a", partitions=True),
        r"partitions must be an int >= 1, not bool True",
    ),
    (
        "app partitions float",
        lambda d: flowkit.App("a", partitions=2.0),
        r"partitions must be an int >= 1, not float 2.0",
    ),
    (
        "app broker",
        lambda d: flowkit.App("a", broker=5),
        r"App\(\): broker must be a non-empty str",
    ),
    (
        "app commit_interval",
        lambda d: flowkit.App("a", commit_interval=0),
        r"commit_interval must be > 0",
    ),
    (
        "app commit_interval inf",
        lambda d: flowkit.App("a", commit_interval=float("inf")),
        r"commit_interval must be a finite",
    ),
    # app.topic
    ("topic name", lambda d: d.app.topic(5), r"topic name must be a str, not int 5"),
    (
        "topic value_type",
        lambda d: d.app.topic("x", value_type=5),
        r"topic 'x': value_type must be a type .*, not int 5",
    ),
    (
        "topic value_type str",
        lambda d: d.app.topic("x", value_type="int"),
        r"topic 'x': value_type must be a type .*, not str 'int'",
    ),
    (
        "topic key_type",
        lambda d: d.app.topic("x", key_type=5),
        r"topic 'x': key_type must be a type",
    ),
    (
        "topic partitions str",
        lambda d: d.app.topic("x", partitions="4"),
        r"topic 'x': partitions must be an int >= 1, not str '4'",
    ),
    (
        "topic partitions float",
        lambda d: d.app.topic("x", partitions=1.5),
        r"topic 'x': partitions must be an int >= 1",
    ),
    (
        "topic partitions -1",
        lambda d: d.app.topic("x", partitions=-1),
        r"topic 'x': partitions must be an int >= 1, not int -1",
    ),
    (
        "topic compacted",
        lambda d: d.app.topic("x", compacted="yes"),
        r"topic 'x': compacted must be True or False",
    ),
    ("topic codec", lambda d: d.app.topic("x", codec="xml"), r"unknown codec 'xml'"),
    (
        "topic.group_by key",
        lambda d: d.topic.group_by(5, name="g"),
        r"group_by\(\): key must be a function, not int 5",
    ),
    (
        "topic.group_by name",
        lambda d: d.topic.group_by(abs, name=5),
        r"group_by\(\): name must be a str",
    ),
    (
        "topic.group_by partitions",
        lambda d: d.topic.group_by(abs, name="g", partitions=0),
        r"group_by\(\): partitions must be an int >= 1",
    ),
    # app.agent
    (
        "agent topic int",
        lambda d: d.agent(123),
        r"@app.agent\(\): topic must be a topic .*, not int 123",
    ),
    (
        "agent topic None",
        lambda d: d.agent(None),
        r"@app.agent\(\): topic must be a topic .*, not NoneType None",
    ),
    (
        "agent topic list",
        lambda d: d.agent([d.topic, 7]),
        r"@app.agent\(\): topic must be .*, not int 7",
    ),
    (
        "agent name",
        lambda d: d.agent(name=5),
        r"@app.agent\(\): name must be a non-empty str, not int 5",
    ),
    (
        "agent sink int",
        lambda d: d.agent(sink=42),
        r"agent 'body': sink must be a topic, a topic name, an agent, a Sink or a function, "
        r"not int 42",
    ),
    (
        "agent sink list",
        lambda d: d.agent(sink=[d.other, 42]),
        r"agent 'body': sink must be .*, not int 42",
    ),
    (
        "agent sink half",
        lambda d: d.agent(sink=NotASink()),
        r"agent 'body': sink must be .*, not NotASink",
    ),
    (
        "agent sink name",
        lambda d: d.agent(sink="bad name"),
        r"agent 'body': sink topic name 'bad name' may use only",
    ),
    (
        "sink options type",
        lambda d: d.agent(sink=BadOptions([1])),
        r"sink 'BadOptions': runner_options must be a dict",
    ),
    (
        "sink options key",
        lambda d: d.agent(sink=BadOptions({"size": 1})),
        r"sink 'BadOptions': runner_options has no option 'size' "
        r"\(it takes batch_size, max_pending, retry\)",
    ),
    (
        "sink options batch",
        lambda d: d.agent(sink=BadOptions({"batch_size": 0})),
        r"sink 'BadOptions': runner_options batch_size must be an int >= 1",
    ),
    (
        "sink options pending",
        lambda d: d.agent(sink=BadOptions({"max_pending": "9"})),
        r"runner_options max_pending must be an int >= 1",
    ),
    (
        "sink options retry",
        lambda d: d.agent(sink=BadOptions({"retry": 3})),
        r"runner_options retry must be a flowkit.Retry",
    ),
    (
        "agent concurrency str",
        lambda d: d.agent(concurrency="2"),
        r"agent 'body': concurrency must be an int >= 1, not str '2'",
    ),
    (
        "agent concurrency 0",
        lambda d: d.agent(concurrency=0),
        r"agent 'body': concurrency must be an int >= 1, not int 0",
    ),
    (
        "agent per_record",
        lambda d: d.agent(per_record="x"),
        r"agent 'body': per_record must be True or False",
    ),
    (
        "agent on_error str",
        lambda d: d.agent(on_error="skip"),
        r"agent 'body': on_error must be a flowkit.ErrorPolicy or a dict",
    ),
    (
        "agent on_error action",
        lambda d: d.agent(on_error={ValueError: "x"}),
        r"error policy action 'x' must be",
    ),
    (
        "agent dead_letter",
        lambda d: d.agent(dead_letter=5),
        r"agent 'body': dead_letter must be a str, not int 5",
    ),
    (
        "agent dead_letter name",
        lambda d: d.agent(dead_letter="no good"),
        r"agent 'body': dead_letter 'no good' may use only",
    ),
    (
        "agent fn",
        lambda d: d.app.agent(d.topic)(5),
        r"@app.agent\(\) decorates a function, not int 5",
    ),
    # tables
    ("table name", lambda d: d.app.table(5), r"table name must be a str, not int 5"),
    (
        "table partitions",
        lambda d: d.app.table("x", partitions="2"),
        r"table 'x': partitions must be an int >= 1, not str '2'",
    ),
    (
        "table key_type",
        lambda d: d.app.table("x", key_type=5),
        r"table 'x': key_type must be a type",
    ),
    (
        "table value_type",
        lambda d: d.app.table("x", value_type=5),
        r"table 'x': value_type must be a type",
    ),
    (
        "table default",
        lambda d: d.app.table("x", default=5),
        r"table 'x': default must be callable",
    ),
    (
        "global_table loader",
        lambda d: d.app.global_table("g", loader=5),
        r"table 'g': loader must be a function, not int 5",
    ),
    (
        "global_table partitions",
        lambda d: d.app.global_table("g", partitions="1"),
        r"partitions must be an int >= 1",
    ),
    # windowed tables
    ("tumbling size", lambda d: d.app.table("w").tumbling("10"), r"window size must be seconds"),
    (
        "tumbling combine",
        lambda d: d.app.table("w").tumbling(10, combine=5),
        r"table 'w': combine must be a function, not int 5",
    ),
    (
        "tumbling on_close",
        lambda d: d.app.table("w").tumbling(10, on_close=5),
        r"table 'w': on_close must be a function",
    ),
    (
        "tumbling to",
        lambda d: d.app.table("w").tumbling(10, to="t"),
        r"table 'w': to must be a topic declared with app.topic\(\), not str 't'",
    ),
    (
        "tumbling time",
        lambda d: d.app.table("w").tumbling(10, time=5),
        r"table 'w': time must be a function",
    ),
    (
        "tumbling emit",
        lambda d: d.app.table("w").tumbling(10, emit=5, to=d.topic),
        r"table 'w': emit must be a function",
    ),
    (
        "tumbling idle_timeout",
        lambda d: d.app.table("w").tumbling(10, idle_timeout=-1),
        r"table 'w': idle_timeout must be > 0 seconds",
    ),
    (
        "tumbling unknown",
        lambda d: d.app.table("w").tumbling(10, bogus=1),
        r"table 'w': tumbling\(\) has no option 'bogus' \(it takes .*combine",
    ),
    (
        "hopping unknown",
        lambda d: d.app.table("w").hopping(10, 5, sise=1),
        r"table 'w': hopping\(\) has no option 'sise'",
    ),
    # joins
    ("join within str", lambda d: d.join(within="1"), r"join 'j': within must be seconds"),
    ("join within -1", lambda d: d.join(within=-1), r"join 'j': within must be >= 0 seconds"),
    ("join grace None", lambda d: d.join(within=1, grace=None), r"join 'j': grace must be seconds"),
    (
        "join name",
        lambda d: d.join(name=5, within=1),
        r"table name must be a str|join name must be a str",
    ),
    (
        "join how",
        lambda d: d.join(within=1, how="cross"),
        r"join 'j': how must be 'inner', 'left' or 'outer'",
    ),
    # timers, crontabs, tasks
    ("timer interval", lambda d: d.app.timer("1")(tick), r"timer 'tick': interval must be seconds"),
    (
        "timer name",
        lambda d: d.app.timer(1, name=5)(tick),
        r"timer name must be a non-empty str, not int 5",
    ),
    (
        "timer on_leader",
        lambda d: d.app.timer(1, on_leader="x")(tick),
        r"timer 'tick': on_leader must be True or False",
    ),
    ("timer fn", lambda d: d.app.timer(1)(5), r"timer '5' must be async def"),
    (
        "crontab on_error",
        lambda d: d.app.crontab("* * * * *", on_error="x")(tick),
        r"timer 'tick': on_error must be",
    ),
    ("task fn", lambda d: d.app.task(5), r"task '5' must be async def"),
    ("task on_error", lambda d: d.app.task(on_error="x")(tick), r"task 'tick': on_error must be"),
    # error policies
    (
        "Retry attempts str",
        lambda d: flowkit.Retry(attempts="3"),
        r"Retry\(attempts=\) must be an int >= 1, not str '3'",
    ),
    (
        "Retry jitter str",
        lambda d: flowkit.Retry(jitter="x"),
        r"Retry\(jitter=\) must be a number within \[0, 1\]",
    ),
    ("ErrorPolicy rules", lambda d: flowkit.ErrorPolicy(5), r"ErrorPolicy rules must be a dict"),
    # the app's metrics
    (
        "metric name",
        lambda d: d.app.metrics.counter(5, "d"),
        r"metric name must be a str, not int 5",
    ),
    (
        "metric documentation",
        lambda d: d.app.metrics.counter("c", 5),
        r"metric 'c': documentation must be a non-empty str",
    ),
    (
        "metric labels",
        lambda d: d.app.metrics.counter("c", "d", labels="ab"),
        r"metric 'c': labels must be a list of str",
    ),
    (
        "metric buckets",
        lambda d: d.app.metrics.histogram("c", "d", buckets=5),
        r"metric 'c': buckets must be a list of numbers",
    ),
]


@pytest.mark.parametrize(
    ("declare", "message"), [(d, m) for _, d, m in BAD], ids=[i for i, _, _ in BAD]
)
def test_a_wrong_declaration_is_one_line_naming_the_argument(
    declare: Declare, message: str
) -> None:
    with pytest.raises((DefinitionError, ConfigurationError), match=message) as info:
        declare(Declared())
    assert "\n" not in str(info.value)


def test_right_declarations_still_pass() -> None:
    d = Declared()
    d.app.table("w").tumbling(timedelta(seconds=10), combine=max, idle_timeout=None)
    d.agent(sink=[d.other, "o", print], concurrency=2, dead_letter="my-dlq", name="ok")
    d.join(within=timedelta(seconds=1), grace=0)
    flowkit.App("x", partitions=3, commit_interval=timedelta(seconds=2))
    d.app.metrics.histogram("h", "doc", labels=("a",), buckets=[0.1, 1])


NOT_PARTITIONS = st.one_of(
    st.integers(max_value=0), st.text(), st.floats(), st.booleans(), st.binary(), st.none()
)


@given(NOT_PARTITIONS)
def test_partitions_not_a_positive_int_are_refused_in_one_line(partitions: Any) -> None:
    app = flowkit.App("p")
    declarations: list[Callable[[], Any]] = [lambda: flowkit.App("a", partitions=partitions)]
    if partitions is not None:  # None: the app's own, for a topic or a table
        declarations += [
            lambda: app.topic("t", partitions=partitions),
            lambda: app.table("t", partitions=partitions),
            lambda: app.global_table("g", partitions=partitions),
            lambda: app.topic("t").group_by(abs, name="g", partitions=partitions),
        ]
    for declare in declarations:
        with pytest.raises(DefinitionError, match="partitions must be an int >= 1, not ") as info:
            declare()
        assert "\n" not in str(info.value)


@given(st.integers(min_value=1, max_value=10_000))
def test_any_positive_partitions_are_taken(partitions: int) -> None:
    app = flowkit.App("p", partitions=partitions)
    assert app.topic("t").partitions == partitions
    assert app.table("c").partitions == partitions


def test_a_group_by_in_an_agent_body_is_checked_when_the_agent_is_declared() -> None:
    app = flowkit.App("hops")
    clicks = app.topic("clicks", value_type=int)

    with pytest.raises(DefinitionError, match=r"group_by\(name='g'\): partitions must be an int"):

        @app.agent(clicks)
        async def negative(stream: Any) -> None:
            async for _ in stream.group_by(abs, name="g", partitions=-2):
                pass

    with pytest.raises(DefinitionError, match=r"group_by\(name='a b'\): name 'a b' may use only"):

        @app.agent(clicks)
        async def spaced(stream: Any) -> None:
            async for _ in stream.group_by(abs, name="a b"):
                pass
