"""``decide``: what happens to a failed record, as a table of cases and as properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.errors import (
    DecodeError,
    DefinitionError,
    FutureRecord,
    LateRecord,
    MissingFieldError,
    NotRunningError,
    RecordRejected,
    SinkError,
    TooManyFailures,
    TransportError,
)
from flowkit.policies import Action
from flowkit.runtime.flow.failures import Decision, Where, decide

RETRY3 = flowkit.Retry(attempts=3, then="skip")

# (class, action, keywords) -> (verb, stage, counted)
CASES: list[tuple[type[BaseException], Action, dict[str, Any], tuple[str, str, bool]]] = [
    # 1: not the record's fault, whatever the policy
    (DefinitionError, "dead_letter", {}, ("raise", "process", False)),
    (NotRunningError, "skip", {}, ("raise", "process", False)),
    (TooManyFailures, RETRY3, {}, ("raise", "process", False)),
    (TransportError, "dead_letter", {"at": "list"}, ("raise", "process", False)),
    # 2, 3: between records
    (ValueError, "dead_letter", {"at": "between"}, ("restart", "process", False)),
    (ValueError, "dead_letter", {"at": "between", "fail_fast": True}, ("raise", "process", False)),
    (RecordRejected, "skip", {"at": "between"}, ("raise", "process", False)),
    # 4, 5: bytes that do not decode
    (DecodeError, "skip", {"owner": False}, ("pass", "decode", True)),
    (DecodeError, "dead_letter", {"owner": False, "fail_fast": True}, ("pass", "decode", False)),
    (DecodeError, "skip", {}, ("dead_letter", "decode", True)),
    (DecodeError, RETRY3, {}, ("dead_letter", "decode", True)),
    (DecodeError, "stop", {}, ("dead_letter", "decode", True)),
    (DecodeError, "dead_letter", {"fail_fast": True}, ("stop", "decode", False)),
    (DecodeError, "dead_letter", {"at": "list"}, ("dead_letter", "decode", True)),
    # 6, 7: refused for good, never replayed
    (RecordRejected, RETRY3, {}, ("skip", "output", True)),
    (RecordRejected, "dead_letter", {"at": "past"}, ("dead_letter", "output", False)),
    (RecordRejected, "stop", {"at": "past"}, ("stop", "output", False)),
    (ValueError, RETRY3, {"at": "list"}, ("skip", "process", True)),
    (SinkError, RETRY3, {"at": "past"}, ("skip", "sink", False)),
    # 8, 9: retries, then their then
    (ValueError, RETRY3, {"attempt": 1}, ("retry", "process", False)),
    (ValueError, RETRY3, {"attempt": 2}, ("retry", "process", False)),
    (ValueError, RETRY3, {"attempt": 3}, ("skip", "process", True)),
    (ValueError, RETRY3, {"attempt": 2, "fail_fast": True}, ("retry", "process", False)),
    (ValueError, RETRY3, {"attempt": 3, "fail_fast": True}, ("stop", "process", False)),
    (ValueError, flowkit.Retry(attempts=1), {}, ("dead_letter", "process", True)),
    # 10, 11: the ladder
    (ValueError, "stop", {}, ("stop", "process", False)),
    (ValueError, "skip", {"fail_fast": True}, ("stop", "process", False)),
    (ValueError, "skip", {}, ("skip", "process", True)),
    (ValueError, "dead_letter", {}, ("dead_letter", "process", True)),
    (ValueError, "dead_letter", {"at": "past"}, ("dead_letter", "process", False)),
    (MissingFieldError, "dead_letter", {}, ("dead_letter", "process", True)),
    (LateRecord, "dead_letter", {"at": "list"}, ("dead_letter", "window", True)),
    (FutureRecord, "skip", {}, ("skip", "window", True)),
]


@pytest.mark.parametrize(("kind", "action", "given_", "expected"), CASES)
def test_the_table_of_failures(
    kind: type[BaseException],
    action: Action,
    given_: dict[str, Any],
    expected: tuple[str, str, bool],
) -> None:
    decision = decide(kind, action, **given_)
    assert (decision.verb, decision.stage, decision.counted) == expected
    assert decision.settles == (decision.verb in ("dead_letter", "skip", "pass"))
    assert (decision.retry is not None) == (decision.verb == "retry")


def test_a_window_names_why_it_refused_the_record() -> None:
    assert decide(LateRecord, "skip").window == "late"
    assert decide(FutureRecord, "stop").window == "future"
    assert decide(ValueError, "skip").window is None


class _Custom(ValueError):
    pass


KINDS: list[type[BaseException]] = [
    ValueError,
    _Custom,
    KeyError,
    DecodeError,
    MissingFieldError,
    LateRecord,
    FutureRecord,
    SinkError,
    RecordRejected,
    TransportError,
    DefinitionError,
    NotRunningError,
    TooManyFailures,
]
TERMINAL = st.sampled_from(["dead_letter", "skip", "stop"])
ACTIONS = TERMINAL | st.builds(
    flowkit.Retry, attempts=st.integers(1, 5), backoff=st.just(0.0), then=TERMINAL
)
WHERE: list[Where] = ["record", "list", "past", "between"]


def _ladder(
    kind: type[BaseException],
    action: Action,
    attempt: int,
    owner: bool,
    fail_fast: bool,
    at: Where,
) -> tuple[str, str, bool]:
    """The reference ``decide`` is held to (verb, stage, counted by the guard): the rules
    written out path by path, as the dispatcher meets each failure."""
    stage = getattr(kind, "stage", "process")
    if issubclass(kind, DefinitionError | NotRunningError | TooManyFailures) or (
        issubclass(kind, TransportError) and not issubclass(kind, RecordRejected)
    ):
        return "raise", stage, False  # not the record's fault
    if at == "between":  # no current record
        if fail_fast or issubclass(kind, RecordRejected):
            return "raise", stage, False
        return "restart", stage, False
    if at == "past":  # an output refused, a sink that gave up: no guard, no retry
        if issubclass(kind, RecordRejected):
            stage = "output"
        then = action.then if isinstance(action, flowkit.Retry) else action
        if fail_fast or then == "stop":
            return "stop", stage, False
        return then, stage, False
    retry = at == "record"
    if issubclass(kind, DecodeError):
        if not owner:
            return "pass", stage, not fail_fast
        action = "dead_letter"
    if issubclass(kind, RecordRejected):
        stage, retry = "output", False
    if isinstance(action, flowkit.Retry) and not retry:
        action = action.then
    if isinstance(action, flowkit.Retry):
        if attempt < action.attempts:
            return "retry", stage, False
        action = action.then
    if fail_fast or action == "stop":
        return "stop", stage, False
    return action, stage, True


@settings(max_examples=60, deadline=None)  # a small space of inputs
@given(
    st.sampled_from(KINDS),
    ACTIONS,
    st.integers(1, 6),
    st.booleans(),
    st.booleans(),
    st.sampled_from(WHERE),
)
def test_decide_agrees_with_the_rules_written_path_by_path(
    kind: type[BaseException],
    action: Action,
    attempt: int,
    owner: bool,
    fail_fast: bool,
    at: Where,
) -> None:
    # A record is past only when the broker refused its output or a sink gave up on it.
    assume(at != "past" or kind in (RecordRejected, SinkError))
    decision = decide(kind, action, attempt=attempt, owner=owner, fail_fast=fail_fast, at=at)
    assert (decision.verb, decision.stage, decision.counted) == _ladder(
        kind, action, attempt, owner, fail_fast, at
    )
    # The same question, the same answer: a decision can be kept.
    assert decide(kind, action, attempt=attempt, owner=owner, fail_fast=fail_fast, at=at) == (
        decision
    )


@settings(max_examples=60, deadline=None)  # a small space of inputs
@given(
    st.sampled_from(KINDS),
    ACTIONS,
    st.integers(1, 6),
    st.booleans(),
    st.booleans(),
    st.sampled_from(WHERE),
)
def test_what_no_decision_ever_does(
    kind: type[BaseException],
    action: Action,
    attempt: int,
    owner: bool,
    fail_fast: bool,
    at: Where,
) -> None:
    decision = decide(kind, action, attempt=attempt, owner=owner, fail_fast=fail_fast, at=at)
    if fail_fast:  # nothing is dead-lettered or skipped
        assert decision.verb not in ("dead_letter", "skip")
    if decision.verb == "retry":  # only the record in hand, only within its attempts
        assert at == "record" and isinstance(action, flowkit.Retry)
        assert attempt < action.attempts and decision.retry is action
    if decision.counted:  # the guard counts only records it saw, dealt with here
        assert decision.settles and at != "past" and not fail_fast
    if at == "between":
        assert decision.verb in ("raise", "restart")
    # Retries end: once a record is past them, a later attempt is decided the same way.
    if decision.verb != "retry":
        later = decide(kind, action, attempt=attempt + 1, owner=owner, fail_fast=fail_fast, at=at)
        assert later == decision


def test_the_decisions_a_dispatcher_keeps_are_plain_values() -> None:
    decision = decide(ValueError, "skip")
    assert decision == Decision("skip", "process", True, True)
    assert hash(decision) == hash(Decision("skip", "process", True, True))
