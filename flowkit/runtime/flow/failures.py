"""What happens to a record that failed: ``decide`` answers, the dispatcher does it.

``decide`` is a pure function of the failure's class, the action the agent's error policy
gives it, which attempt at the record this is, whether the agent owns the record's bad
bytes, ``fail_fast``, and where the failure happened (``Where``). Its rules, the first that
applies winning:

  # | the failure                                             | verb          | counted
 ---+---------------------------------------------------------+---------------+---------
  1 | not the record's fault: ``DefinitionError``,             | ``raise``     | no
    | ``NotRunningError``, ``TooManyFailures``, a              |               |
    | ``TransportError`` but ``RecordRejected`` (broker away)  |               |
  2 | ``between`` records: ``RecordRejected``, or fail_fast    | ``raise``     | no
  3 | ``between`` records, otherwise                           | ``restart``   | no
  4 | a ``DecodeError`` of a topic whose first reader is       | ``pass``      | yes*
    | another agent (that one dead-letters it)                 |               |
  5 | a ``DecodeError``: bytes that do not decode never will,  | as 10, 11     |
    | so its action is ``dead_letter``, whatever the policy's  |               |
  6 | a ``RecordRejected``: refused for good, never replayed;  | as 7-11       |
    | stage ``output``                                         |               |
  7 | ``Retry``, the record cannot be processed again where    | as 10, 11     |
    | it is (``list``, ``past``, 6): its ``then``              |               |
  8 | ``Retry`` and ``attempt < attempts``                     | ``retry``     | no
  9 | ``Retry``, its attempts used up: its ``then``            | as 10, 11     |
 10 | fail_fast, or the action ``stop``                        | ``stop``      | no
 11 | ``skip`` / ``dead_letter``                               | the same      | yes*

"counted": by the agent instance's ``FailureGuard``. *Not with fail_fast, nor for a record
``past`` (the instance is on another one by then).

A ``retry`` waits ``Retry.delay(attempt)`` and processes the record again; a ``stop``
logs the record and raises (the worker stops, the record is not committed); ``pass`` only
counts it; ``restart`` starts the agent again after a backoff; ``raise`` lets the error
go. ``dead_letter``, ``skip`` and ``pass`` are dealt with where the record failed: the
agent goes on with the next record (``Decision.settles``).

>>> from flowkit import Retry
>>> decide(ValueError, Retry(attempts=3), attempt=1).verb
'retry'
>>> decide(ValueError, Retry(attempts=3), attempt=3).verb
'dead_letter'
>>> decide(ValueError, "skip", fail_fast=True).verb
'stop'

Being pure, a decision can be kept: where neither the attempt nor the owner can change it
(an action that is no ``Retry``, a failure that is no ``DecodeError``), the dispatcher
decides once per exception class, not once per record.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ...errors import (
    DecodeError,
    DefinitionError,
    FutureRecord,
    LateRecord,
    NotRunningError,
    ProcessingError,
    RecordRejected,
    TooManyFailures,
    TransportError,
)
from ...policies import Action, Retry

__all__ = ["Decision", "Verb", "Where", "decide"]

Verb = Literal["retry", "dead_letter", "skip", "pass", "stop", "restart", "raise"]

Where = Literal["record", "list", "past", "between"]
"""Where the failure happened: ``record``, on the record the agent instance is processing
(it can be processed again); ``list``, on a record that cannot be processed again where it
is (one of a ``batches()`` list, or one its stream refused: bytes that do not decode, a
record too late for a join); ``past``, on a record done already (an output the broker then
refused, a batch a sink gave up on); ``between``, outside any record."""

# Not the record's fault, and no dead letter mends it: a mistake in the agent's code, state
# this worker no longer holds, a guard that tripped, the broker away.
_NOT_THE_RECORDS = (DefinitionError, NotRunningError, TooManyFailures, TransportError)
_SETTLES = ("dead_letter", "skip", "pass")


class Decision(msgspec.Struct, frozen=True):
    """What to do with a failed record (see the module's table).

    A frozen Struct, not a NamedTuple: the dispatcher reads several of its fields for
    every failed record, and a Struct's fields are slots, which the interpreter reads
    faster than a tuple's named items."""

    verb: Verb
    stage: str  # named in the record's log line, metric and dead letter
    counted: bool  # by the agent instance's FailureGuard
    # Dealt with where it failed (dead_letter, skip, pass): the agent goes on. A field,
    # not a property: the dispatcher reads it for every failed record.
    settles: bool
    retry: Retry | None = None  # for "retry": whose delay to wait
    window: Literal["late", "future"] | None = None  # a window refused the record: why


def decide(
    kind: type[BaseException],
    action: Action,
    *,
    attempt: int = 1,
    owner: bool = True,
    fail_fast: bool = False,
    at: Where = "record",
) -> Decision:
    """What happens to a record whose processing raised an exception of class ``kind``,
    for which the agent's error policy gives ``action``: at its ``attempt``-th failure
    (1 for the first), ``owner`` if this agent dead-letters the bad bytes of the
    record's topic, failed ``at`` (``Where``)."""
    stage = kind.stage if issubclass(kind, ProcessingError) else "process"
    if issubclass(kind, _NOT_THE_RECORDS) and not issubclass(kind, RecordRejected):
        return _made("raise", stage, False)
    if at == "between":
        if fail_fast or issubclass(kind, RecordRejected):
            return _made("raise", stage, False)
        return _made("restart", stage, False)
    counted = at != "past" and not fail_fast
    replayable = at == "record"
    if issubclass(kind, DecodeError):
        if not owner:
            return _made("pass", stage, counted)
        action = "dead_letter"
    if issubclass(kind, RecordRejected):
        stage, replayable = "output", False
    if isinstance(action, Retry):
        if replayable and attempt < action.attempts:
            return _made("retry", stage, False, action)
        action = action.then
    window: Literal["late", "future"] | None = None
    if issubclass(kind, LateRecord):
        window = "late"
    elif issubclass(kind, FutureRecord):
        window = "future"
    if fail_fast or action == "stop":
        return _made("stop", stage, False, None, window)
    return _made(action, stage, counted, None, window)


def _made(
    verb: Verb,
    stage: str,
    counted: bool,
    retry: Retry | None = None,
    window: Literal["late", "future"] | None = None,
) -> Decision:
    return Decision(verb, stage, counted, verb in _SETTLES, retry, window)
