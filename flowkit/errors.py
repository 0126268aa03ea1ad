"""The flowkit error tree.

```
FlowkitError
├── DefinitionError        a mistake in the app: a bad declaration, an operator misused
│   └── GraphError         the graph fails a check (unknown topic, type mismatch, ...)
├── AppNotFound            the CLI could not load "module:attr"
├── ConfigurationError     a bad setting: broker URL, CLI option, client setting
├── NotRunningError        a runtime-only call (topic.send, table write) with no worker
├── RegistryError          a schema registry could not be reached or refused a request
├── TransportError         broker I/O, mapped from the client library in one place
│   ├── BrokerUnavailable
│   ├── CommitFailed
│   ├── ReadStalled        reading partitions to their end made no progress
│   ├── RecordRejected     one record refused for good (too large, invalid, not authorised)
│   └── TransactionAborted an exactly-once transaction was aborted (a send failed, or fenced)
├── WorkerStalled          lag but no progress for longer than the watchdog allows
├── TooManyFailures        an agent failed on too many records in a row (its FailureGuard)
├── TaskFailed             a timer or task of the app raised (the worker stops)
├── PartialWrite           raised by a sink: the first ``written`` items of a batch are stored
└── ProcessingError        one record failed; carries where it came from
    ├── DecodeError        the bytes could not be decoded into the declared type
    ├── AgentError         the agent raised while processing the record
    ├── MissingFieldError  a transform needs a field the record lacks (also a KeyError)
    ├── SinkError          a sink gave up after its retries
    ├── LateRecord         a record for a window that already closed on its partition
    └── FutureRecord       an event time too far ahead of the wall clock (max_future)
```

Definition, configuration and transport errors stop the worker, except ``RecordRejected``:
the refusal of one record is that record's fault, and follows its agent's error policy.
Processing errors are data: the worker logs them, counts them and goes on with the next
record.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentError",
    "AppNotFound",
    "BrokerUnavailable",
    "CommitFailed",
    "ConfigurationError",
    "DecodeError",
    "DefinitionError",
    "FlowkitError",
    "FutureRecord",
    "GraphError",
    "LateRecord",
    "MissingFieldError",
    "NotRunningError",
    "PartialWrite",
    "ProcessingError",
    "ReadStalled",
    "RegistryError",
    "RecordRejected",
    "SinkError",
    "TaskFailed",
    "TooManyFailures",
    "TransactionAborted",
    "TransportError",
    "WorkerStalled",
]


class FlowkitError(Exception):
    """Base class of every error flowkit raises on purpose."""


class DefinitionError(FlowkitError):
    """The app is wrong: a declaration (raised where it is made, or at worker start), or a
    stream operator an agent calls with a wrong argument (the worker stops with it)."""


class GraphError(DefinitionError):
    """The dataflow graph fails validation; ``problems`` lists one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class AppNotFound(FlowkitError):
    """The ``module:attr`` given to the CLI does not name an App."""


class ConfigurationError(FlowkitError):
    """A setting (broker URL, option, client setting) has a bad value."""


class NotRunningError(FlowkitError):
    """A call that needs a running worker was made outside one."""


class RegistryError(FlowkitError):
    """A schema registry could not be reached, or refused a request (not a record's fault)."""


class TransportError(FlowkitError):
    """The broker could not be reached or refused a request."""


class BrokerUnavailable(TransportError):
    """No broker answered within the configured deadline."""


class CommitFailed(TransportError):
    """An offset commit failed (for example during a rebalance)."""


class ReadStalled(TransportError):
    """Reading partitions to their high watermark (table recovery, dead letters, a test's
    read of a topic) brought no record for too long while some were still below it."""


class RecordRejected(TransportError):
    """The producer or the broker refused one record for a reason that retrying will not
    change: it is too large, invalid, or the topic refuses this client. Other records go
    on; the record that caused it is dead-lettered (or skipped, or stops the worker) by
    its agent's error policy."""


class TransactionAborted(TransportError):
    """An exactly-once transaction was aborted: none of its outputs, changelog writes,
    dead letters or offsets count. ``fenced`` is True when another worker took over this
    worker's partitions (this one was a zombie: paused past its session timeout). The
    worker stops its tasks and starts again from the last committed transaction."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


class WorkerStalled(FlowkitError):
    """The worker holds partitions with lag but processed nothing for too long."""


class TooManyFailures(FlowkitError):
    """An agent failed on ``failures`` of its last ``records`` records (its
    ``FailureGuard``): a bug, more likely than bad input, so the worker stops rather than
    dead-letter the rest. The record that tripped the guard is not committed.

    >>> error = TooManyFailures("a", failures=3, records=3, error=KeyError("k"), where="t/0")
    >>> str(error)
    "agent 'a' failed on 3 records in a row, the last with KeyError: 'k' (t/0, not committed)"
    """

    def __init__(
        self, agent: str, *, failures: int, records: int, error: BaseException, where: str
    ) -> None:
        self.agent = agent
        self.failures = failures
        self.records = records
        self.error_type = type(error).__name__
        message = str(error)
        # On one line, and short: it ends up as the worker's one ``Error:`` line.
        message = " ".join(message.split())
        self.error_message = message if len(message) <= 300 else message[:299] + "…"
        many = (
            f"{failures:,} records in a row"
            if records == failures
            else (f"{failures:,} of its last {records:,} records")
        )
        last = f"{self.error_type}: {self.error_message}" if self.error_message else self.error_type
        super().__init__(
            f"agent {agent!r} failed on {many}, the last with {last} ({where}, not committed)"
        )


class TaskFailed(FlowkitError):
    """A timer or task of the app raised; the worker stops with it unless
    the task's ``on_error`` says ``"restart"`` or ``"ignore"``."""


class PartialWrite(FlowkitError):
    """Raised by a sink's ``write_batch`` when the first ``written`` items were stored and
    the next one failed: only the rest is retried, and only the failing item is given up."""

    def __init__(self, written: int, cause: BaseException) -> None:
        super().__init__(f"{written} written, then {cause!r}")
        self.written = written
        self.cause = cause


class ProcessingError(FlowkitError):
    """One record failed; says where it came from and in which stage."""

    stage = "process"
    # Where it came from: class defaults, so that an error made without them (``at``)
    # needs no instance attributes.
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    agent: str | None = None

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        agent: str | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.agent = agent


class DecodeError(ProcessingError):
    """The record's bytes do not decode into the topic's declared type."""

    stage = "decode"


class AgentError(ProcessingError):
    """The agent raised while processing a record."""

    stage = "process"


class MissingFieldError(ProcessingError, KeyError):
    """A field a transform needs is missing (or a value on its path is not a dict or list).

    Also a ``KeyError``; ``path`` is the field's path.
    """

    def __init__(self, message: str, *, path: tuple[str | int, ...] = (), **where: Any) -> None:
        super().__init__(message, **where)
        self.path = path

    @classmethod
    def at(cls, message: str, path: tuple[str | int, ...]) -> MissingFieldError:
        """The error for ``path``, made without running ``__init__``: a transform makes
        one per record that lacks a field, and the two Python ``__init__`` calls (with
        their keywords) cost 3.5 times what the exception itself does.

        >>> error = MissingFieldError.at("pick: field 'a' is missing", ("a",))
        >>> str(error), error.path, error.topic
        ("pick: field 'a' is missing", ('a',), None)
        """
        error = cls.__new__(cls, message)  # sets ``args``, as BaseException's own does
        error.path = path
        return error

    # KeyError's would quote the message; BaseException's own gives it as it is, in C (a
    # dead letter reads it once per failing record).
    __str__ = BaseException.__str__


class SinkError(ProcessingError):
    """A sink could not take an output after its retries."""

    stage = "sink"


class LateRecord(ProcessingError):
    """A record arrived for a window that has already closed on its partition."""

    stage = "window"


class FutureRecord(ProcessingError):
    """A record's event time is further ahead of the wall clock than ``max_future``."""

    stage = "window"
