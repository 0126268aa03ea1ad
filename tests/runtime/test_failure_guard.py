"""The failure guard: an agent that fails on (nearly) every record stops the worker, or
pauses, instead of dead-lettering its whole input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.records import Message
from flowkit.runtime.flow.guards import FailureCounter
from flowkit.testing import TestDriver
from tests.conftest import DriverFactory

FORMS = ["stream", "per_record"]
DEFAULT = flowkit.FailureGuard()


def failing_app(
    form: str,
    fails: Callable[[int], bool],
    *,
    name: str = "guarded",
    guard: Any = flowkit.policies.APP_DEFAULT,
    app_guard: Any = DEFAULT,
    **agent_options: Any,
) -> tuple[flowkit.App, flowkit.Topic[int], flowkit.Topic[int]]:
    """An app whose agent ``handle`` raises ``ValueError`` on the numbers ``fails`` picks
    and sends the others to ``out``, in the stream form or the per-record form."""
    app = flowkit.App(name, failure_guard=app_guard)
    nums = app.topic("nums", value_type=int, partitions=1)
    out = app.topic("out", value_type=int)
    options = {"sink": [out], "failure_guard": guard, **agent_options}
    if form == "stream":

        @app.agent(nums, **options)
        async def handle(stream: flowkit.Stream[int]) -> AsyncIterator[int]:
            async for n in stream:
                if fails(n):
                    raise ValueError(f"cannot handle {n}")
                yield n

    else:

        @app.agent(nums, per_record=True, **options)
        def handle(n: int) -> int:
            if fails(n):
                raise ValueError(f"cannot handle {n}")
            return n

    return app, nums, out


def source_offsets(letters: list[Message]) -> list[int]:
    return [int(dict(m.headers)["flowkit.source.offset"]) for m in letters]


# -- stopping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_an_agent_failing_on_every_record_stops_the_worker_at_the_threshold(
    make_driver: DriverFactory, form: str
) -> None:
    guard = flowkit.FailureGuard(failures=25)
    app, nums, _ = failing_app(form, lambda n: True, guard=guard)
    async with make_driver(app) as driver:
        for i in range(100):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures) as caught:
            await driver.run_until_idle()
        error = caught.value
        assert str(error) == (
            "agent 'handle' failed on 25 records in a row, the last with ValueError: "
            "cannot handle 24 (nums/0 offset 24, not committed)"
        )
        assert (error.agent, error.failures, error.error_type) == ("handle", 25, "ValueError")
        assert driver.worker.metrics.guard_trips.labels("handle", "stop")._value.get() == 1
    # The first 24 failures are dead letters, committed; the 25th is neither.
    assert source_offsets(await driver.dead_letters()) == list(range(24))

    # A fixed deploy (the same app name: the same consumer group) goes on from the 25th.
    fixed, nums, out = failing_app(form, lambda n: False)
    async with make_driver(fixed) as driver:
        await driver.run_until_idle()
        assert await driver.values(out) == list(range(24, 100))
        assert len(await driver.dead_letters()) == 24


async def test_the_default_guard_stops_after_1000_failures_in_a_row() -> None:
    app, nums, _ = failing_app("per_record", lambda n: True)
    async with TestDriver(app) as driver:
        for i in range(1500):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="failed on 1,000 records in a row"):
            await driver.run_until_idle()
    assert len(await driver.dead_letters()) == 999


@pytest.mark.parametrize("form", FORMS)
async def test_a_success_starts_the_count_again(make_driver: DriverFactory, form: str) -> None:
    # Nine failures, then one record that goes through, again and again: never ten in a row.
    app, nums, out = failing_app(
        form, lambda n: n % 10 != 9, guard=flowkit.FailureGuard(failures=10)
    )
    async with make_driver(app) as driver:
        for i in range(300):
            await driver.send(nums, i)
        await driver.run_until_idle()
        assert await driver.values(out) == list(range(9, 300, 10))
        assert len(await driver.dead_letters()) == 270
        assert driver.worker.metrics.guard_trips.labels("handle", "stop")._value.get() == 0


@pytest.mark.parametrize("form", FORMS)
async def test_a_failure_rate_over_a_window_of_records(form: str) -> None:
    # 4 in 10 fail: under 5 of the last 10 it goes on; 5 of 10 stops the worker.
    pattern = {0, 3, 5, 8}
    ok_app, nums, out = failing_app(
        form, lambda n: n % 10 in pattern, guard=flowkit.FailureGuard(failures=5, records=10)
    )
    async with TestDriver(ok_app) as driver:
        for i in range(200):
            await driver.send(nums, i)
        await driver.run_until_idle()
        assert len(await driver.dead_letters()) == 80
        assert len(await driver.values(out)) == 120

    worse = {0, 3, 5, 7, 8}
    bad_app, nums, _ = failing_app(
        form, lambda n: n % 10 in worse, guard=flowkit.FailureGuard(failures=5, records=10)
    )
    async with TestDriver(bad_app) as driver:
        for i in range(200):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="failed on 5 of its last 10 records"):
            await driver.run_until_idle()
        assert source_offsets(await driver.dead_letters()) == [0, 3, 5, 7]  # 8 tripped it


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    form=st.sampled_from(FORMS),
    # Runs of 1 to 3 failures, each followed by 19 to 60 records that go through: 5 % of
    # the records fail on average, never more than 3 in a row nor 15 of any 100.
    runs=st.lists(st.tuples(st.integers(1, 3), st.integers(19, 60)), min_size=5, max_size=25),
    garbage=st.sets(st.integers(0, 999), max_size=30),
)
async def test_a_normal_bad_record_rate_never_trips_it(
    form: str, runs: list[tuple[int, int]], garbage: set[int]
) -> None:
    bad: set[int] = set()
    n = 0
    for failing, passing in runs:
        bad.update(range(n, n + failing))
        n += failing + passing
    app, nums, out = failing_app(
        form, bad.__contains__, guard=flowkit.FailureGuard(failures=4), app_guard=None
    )
    async with TestDriver(app) as driver:
        for i in range(n):
            if i in garbage:  # records that do not decode: neither failures nor successes
                await driver.send_raw(nums, b"not a number")
            else:
                await driver.send(nums, i)
        await driver.run_until_idle()
        junk = garbage & set(range(n))
        assert len(await driver.dead_letters()) == len(bad - junk) + len(junk)
        assert len(await driver.values(out)) == n - len(bad | junk)
        assert driver.worker.error is None


@pytest.mark.parametrize("form", FORMS)
async def test_input_errors_neither_count_nor_break_a_run(form: str) -> None:
    app, nums, _ = failing_app(form, lambda n: True, guard=flowkit.FailureGuard(failures=20))
    async with TestDriver(app) as driver:
        for _ in range(30):  # all garbage: dead letters, but no bug of the agent's
            await driver.send_raw(nums, b"garbage")
        await driver.run_until_idle()
        assert len(await driver.dead_letters()) == 30
        # A bug, with garbage between: the garbage does not start the count again.
        for i in range(60):
            if i % 3 == 0:
                await driver.send_raw(nums, b"garbage")
            else:
                await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="failed on 20 records in a row"):
            await driver.run_until_idle()


@pytest.mark.parametrize("form", FORMS)
async def test_errors_of_the_ignored_kinds_are_not_counted(form: str) -> None:
    # A record without a field a transform needs is the input's fault, as are one's own
    # validation errors once they are in ``ignore``.
    class Invalid(ValueError):
        pass

    def fails(n: int) -> bool:
        if n % 2:
            raise flowkit.MissingFieldError.at("pick: field 'x' is missing", ("x",))
        raise Invalid(f"{n} is even")

    guard = flowkit.FailureGuard(failures=5, ignore=(*flowkit.policies.INPUT_ERRORS, Invalid))
    app, nums, _ = failing_app(form, fails, guard=guard)
    async with TestDriver(app) as driver:
        for i in range(40):
            await driver.send(nums, i)
        await driver.run_until_idle()
        assert len(await driver.dead_letters()) == 40


@pytest.mark.parametrize("form", FORMS)
async def test_ignored_errors_between_failures_do_not_break_a_run(form: str) -> None:
    def fails(n: int) -> bool:
        if n % 3 == 0:
            raise flowkit.MissingFieldError.at("pick: field 'x' is missing", ("x",))
        return True  # the bug: every other record fails

    app, nums, _ = failing_app(form, fails, guard=flowkit.FailureGuard(failures=10))
    async with TestDriver(app) as driver:
        for i in range(40):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="10 records in a row"):
            await driver.run_until_idle()


@pytest.mark.parametrize("form", FORMS)
async def test_decode_errors_count_when_the_guard_says_so(form: str) -> None:
    guard = flowkit.FailureGuard(failures=5, ignore=(flowkit.LateRecord, flowkit.FutureRecord))
    app, nums, _ = failing_app(form, lambda n: False, guard=guard)
    async with TestDriver(app) as driver:
        for _ in range(10):
            await driver.send_raw(nums, b"a schema this app does not know")
        with pytest.raises(flowkit.TooManyFailures, match="the last with DecodeError"):
            await driver.run_until_idle()
        assert len(await driver.dead_letters()) == 4


async def test_retries_count_once_per_record() -> None:
    app, nums, _ = failing_app(
        "stream",
        lambda n: True,
        guard=flowkit.FailureGuard(failures=5),
        on_error={ValueError: flowkit.Retry(attempts=3, backoff=0.001)},
    )
    async with TestDriver(app) as driver:
        for i in range(10):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="5 records in a row"):
            await driver.run_until_idle()
    letters = await driver.dead_letters()
    assert source_offsets(letters) == [0, 1, 2, 3]
    assert {dict(m.headers)["flowkit.attempts"] for m in letters} == {b"3"}


async def test_skipped_records_count_too() -> None:
    app, nums, _ = failing_app(
        "per_record",
        lambda n: True,
        guard=flowkit.FailureGuard(failures=5),
        on_error={ValueError: "skip"},
    )
    async with TestDriver(app) as driver:
        for i in range(10):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures):
            await driver.run_until_idle()
        assert driver.worker.metrics.skipped.labels("handle")._value.get() == 4


@pytest.mark.parametrize("where", ["agent", "app"])
async def test_the_guard_can_be_turned_off(where: str) -> None:
    if where == "agent":
        app, nums, _ = failing_app("per_record", lambda n: True, guard=None)
    else:
        app, nums, _ = failing_app("per_record", lambda n: True, app_guard=None)
    async with TestDriver(app) as driver:
        for i in range(1200):
            await driver.send(nums, i)
        await driver.run_until_idle()
        assert len(await driver.dead_letters()) == 1200


async def test_the_agent_setting_wins_over_the_apps() -> None:
    app, nums, _ = failing_app(
        "stream",
        lambda n: True,
        guard=flowkit.FailureGuard(failures=3),
        app_guard=flowkit.FailureGuard(failures=50),
    )
    async with TestDriver(app) as driver:
        for i in range(10):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="3 records in a row"):
            await driver.run_until_idle()


class Click(flowkit.Record):
    user: str
    campaign: str


async def test_a_group_by_agent_counts_the_records_it_reads_back() -> None:
    # Each record is read twice (forwarded, then read back from the repartition topic): the
    # forwarded ones are not records of the agent, and do not break its run of failures.
    app = flowkit.App("regroup", failure_guard=flowkit.FailureGuard(failures=30))
    clicks = app.topic("clicks", value_type=Click, partitions=1)

    @app.agent(clicks)
    async def per_campaign(stream: flowkit.Stream[Click]) -> None:
        async for click in stream.group_by(lambda c: c.campaign, name="by-campaign"):
            raise ValueError(f"no campaign {click.campaign}")

    async with TestDriver(app, max_fetch_records=7) as driver:
        for i in range(100):
            await driver.send(clicks, Click(f"u{i}", "c1"), key=f"u{i}")
        with pytest.raises(flowkit.TooManyFailures, match="30 records in a row"):
            await driver.run_until_idle()
    assert len(await driver.dead_letters()) == 29


async def test_a_batches_list_that_fails_counts_each_of_its_records() -> None:
    app = flowkit.App("lists", failure_guard=flowkit.FailureGuard(failures=10))
    nums = app.topic("nums", value_type=int, partitions=1)

    @app.agent(nums)
    async def save(stream: flowkit.Stream[int]) -> None:
        async for chunk in stream.batches(max_size=4, within_seconds=0.01):
            raise ConnectionError(f"cannot save {len(chunk)} rows")

    async with TestDriver(app) as driver:
        for i in range(40):
            await driver.send(nums, i)
        with pytest.raises(flowkit.TooManyFailures, match="10 records in a row"):
            await driver.run_until_idle()
    assert len(await driver.dead_letters()) == 9


class Ev(flowkit.Record):
    id: str


async def test_a_join_agent_failing_on_half_its_records_trips_a_rate() -> None:
    # An order then its payment: the payment makes the result, which the agent fails on.
    app = flowkit.App("joins", failure_guard=flowkit.FailureGuard(failures=10, records=20))
    orders = app.topic("orders", value_type=Ev, partitions=1)
    payments = app.topic("payments", value_type=Ev, partitions=1)
    paid = app.join(orders, payments, within=5.0, name="paid")

    @app.agent(paid)
    async def match(stream: flowkit.Stream[flowkit.Joined]) -> None:
        async for j in stream:
            raise ValueError(f"cannot match {j.key}")

    t0 = 1_700_000_000_000
    async with TestDriver(app) as driver:
        for i in range(40):
            await driver.send(orders, Ev(f"o{i}"), key=f"k{i}", timestamp_ms=t0 + 10 * i)
            await driver.send(payments, Ev(f"p{i}"), key=f"k{i}", timestamp_ms=t0 + 10 * i + 1)
        with pytest.raises(flowkit.TooManyFailures, match="10 of its last 20 records"):
            await driver.run_until_idle()
    assert len(await driver.dead_letters()) == 9


# -- pausing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_the_pause_option_pauses_the_agent_and_goes_on(
    make_driver: DriverFactory, form: str
) -> None:
    broken = {"now": True}
    guard = flowkit.FailureGuard(failures=5, action="pause", pause=0.005, max_pause=0.02)
    app, nums, out = failing_app(form, lambda n: broken["now"], guard=guard)
    async with make_driver(app) as driver:
        for i in range(200):
            await driver.send(nums, i)
        trips = driver.worker.metrics.guard_trips.labels("handle", "pause")
        async with asyncio.timeout(30):
            while trips._value.get() < 3:  # paused three times: the cause goes away
                assert driver.worker.error is None
                await asyncio.sleep(0.005)
        broken["now"] = False
        await driver.run_until_idle()
        assert driver.worker.error is None
        failed = len(await driver.dead_letters())
        assert 7 <= failed < 200  # 4 before the first pause, one more before each next
        assert await driver.values(out) == list(range(failed, 200))


async def test_the_watchdog_does_not_take_a_pause_for_a_stall() -> None:
    guard = flowkit.FailureGuard(failures=2, action="pause", pause=1.0, max_pause=1.0)
    app, nums, out = failing_app("per_record", lambda n: n < 2, guard=guard)
    # One record a fetch and one batch queued: while the agent pauses, the fetch waits, and
    # its partition has lag.
    async with TestDriver(app, stall_timeout=1.0, max_fetch_records=1, queue_batches=1) as driver:
        for i in range(10):
            await driver.send(nums, i)
        trips = driver.worker.metrics.guard_trips.labels("handle", "pause")
        async with asyncio.timeout(30):
            while trips._value.get() < 1:
                await asyncio.sleep(0.001)
        assert isinstance(driver.clock, flowkit.testing.FakeClock)
        await driver.clock.advance(5)  # the watchdog looks, five times its timeout
        assert driver.worker.error is None
        await driver.run_until_idle()
        assert await driver.values(out) == list(range(2, 10))


# -- the counter ------------------------------------------------------------------------------


MESSAGE = Message("t", 0, 7, 0, None, b"x")

# What happens to each record an agent reads: it goes through, fails, or fails for its
# input's sake (not counted).
OK, FAIL, INPUT = "ok", "fail", "input"


def reference(
    outcomes: list[str], failures: int, records: int, pause: float, max_pause: float
) -> list[tuple[int, float]]:
    """Plainly: after each failure, trip when ``failures`` of the last ``records`` counted
    records failed; each trip pauses twice as long as the one before, unless a failure
    that did not trip came between them. (index of the record, pause) per trip."""
    counted: list[bool] = []
    trips: list[tuple[int, float]] = []
    level = 0
    for i, outcome in enumerate(outcomes):
        if outcome == INPUT:
            continue
        counted.append(outcome == FAIL)
        if outcome != FAIL:
            continue
        if sum(counted[-records:]) >= failures:
            trips.append((i, min(pause * 2**level, max_pause)))
            level += 1
        else:
            level = 0
    return trips


@settings(max_examples=300, deadline=None)
@given(
    outcomes=st.lists(st.sampled_from([OK, FAIL, FAIL, FAIL, INPUT]), max_size=120),
    failures=st.integers(1, 8),
    extra=st.integers(0, 8),
)
def test_the_counter_trips_exactly_as_the_plain_reference(
    outcomes: list[str], failures: int, extra: int
) -> None:
    guard = flowkit.FailureGuard(
        failures=failures, records=failures + extra, action="pause", pause=1.0, max_pause=8.0
    )
    reached = 0
    counter = FailureCounter("a", "a", guard, lambda: reached)
    trips: list[tuple[int, float]] = []
    for i, outcome in enumerate(outcomes):
        reached += 1
        if outcome == OK:
            continue
        exc = flowkit.DecodeError("bad bytes") if outcome == INPUT else ValueError("bug")
        pause = counter.failed(exc, MESSAGE)
        if pause:
            trips.append((i, pause))
    assert trips == reference(outcomes, failures, failures + extra, 1.0, 8.0)


def test_the_counter_stops_with_the_error_named() -> None:
    reached = 0
    counter = FailureCounter("count", "count[1]", flowkit.FailureGuard(failures=3), lambda: reached)
    for _ in range(2):
        reached += 1
        assert counter.failed(KeyError("k"), MESSAGE) == 0.0
    reached += 1
    with pytest.raises(flowkit.TooManyFailures) as caught:
        counter.failed(KeyError("k"), MESSAGE)
    assert str(caught.value) == (
        "agent 'count' failed on 3 records in a row, the last with KeyError: 'k' "
        "(t/0 offset 7, not committed)"
    )


def test_bad_guards_are_definition_errors() -> None:
    with pytest.raises(flowkit.DefinitionError, match="failures"):
        flowkit.FailureGuard(failures=0)
    with pytest.raises(flowkit.DefinitionError, match="records"):
        flowkit.FailureGuard(failures=10, records=5)
    with pytest.raises(flowkit.DefinitionError, match="action"):
        flowkit.FailureGuard(action="restart")  # type: ignore[arg-type]
    with pytest.raises(flowkit.DefinitionError, match="pause"):
        flowkit.FailureGuard(pause=-1)
    with pytest.raises(flowkit.DefinitionError, match="ignore"):
        flowkit.FailureGuard(ignore=("DecodeError",))  # type: ignore[arg-type]
    with pytest.raises(flowkit.DefinitionError, match="failure_guard"):
        flowkit.App("x", failure_guard=1000)  # type: ignore[arg-type]
