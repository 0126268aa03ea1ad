"""Agents: the user's async functions over a topic, and what they send where.

Two forms, both declared with ``@app.agent``:

* the stream form (primary, as in Faust) iterates the stream and may ``yield`` outputs::

      @app.agent(orders, sink=[big_orders])
      async def big(stream):
          async for order in stream.filter(lambda o: o.amount > 100):
              yield order

* the per-record form handles one value and returns an output or None::

      @app.agent(orders, sink=[big_orders], per_record=True)
      def big(order):
          return order if order.amount > 100 else None

  or, a plain generator, yields any number of outputs for it (a router's fan-out).

An output goes to every sink of the agent: topics, other agents (their input topic) and
callables. Yield ``Output(value, key=..., to=...)`` to set the key or headers, or to send
one output to chosen destinations only.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from . import arguments
from .cron import Cron
from .durations import Seconds, seconds
from .errors import DefinitionError
from .policies import APP_DEFAULT, ErrorPolicy, FailureGuard
from .records import Headers
from .topics import Topic

__all__ = ["Agent", "Output", "Timer", "SinkTarget"]

T = TypeVar("T")

SinkTarget = Any
"""A sink: a ``Topic``, a topic name, an ``Agent``, or a callable taking each output."""

KEEP_KEY: Any = object()


class Output(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """An output with its key and headers, optionally routed to chosen sinks.

    By default an output keeps the key of the record that produced it, so a transform
    stays on the same partition number downstream.

    >>> Output({"id": 1}, key="a", to=["audit"]).key
    'a'
    """

    # A frozen msgspec Struct, built in C: a router builds one per output, and this costs
    # about 900 instructions where the NamedTuple it was (a Python __new__) cost 4,000 and
    # the frozen dataclass before it (one object.__setattr__ per field) 8,700.

    value: Any
    key: Any = KEEP_KEY
    headers: Headers = ()
    to: Sequence[SinkTarget] | SinkTarget | None = None


class Agent(Generic[T]):
    """A declared agent: its function, input topic, sinks and concurrency."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        topic: Topic[T] | str | Sequence[Topic[Any] | str],
        sinks: Sequence[SinkTarget] = (),
        concurrency: int = 1,
        per_record: bool = False,
        internal: bool = False,
        on_error: Any = None,
        dead_letter: str | None = None,
        failure_guard: FailureGuard | None = APP_DEFAULT,
    ) -> None:
        arguments.count(concurrency, f"agent {name!r}: concurrency")
        arguments.flag(per_record, f"agent {name!r}: per_record")
        if dead_letter is not None:
            arguments.name(dead_letter, f"agent {name!r}: dead_letter")
        is_gen = inspect.isasyncgenfunction(fn)
        is_coro = inspect.iscoroutinefunction(fn)
        if not per_record and not (is_gen or is_coro):
            raise DefinitionError(
                f"agent {name!r} must be `async def` over a stream; "
                "for a plain function per record use @app.agent(..., per_record=True)"
            )
        if per_record and is_gen:
            raise DefinitionError(
                f"agent {name!r}: a per-record agent returns its output or yields its outputs "
                "(a plain `def`); it cannot be an async generator"
            )
        topics = tuple(topic) if isinstance(topic, list | tuple) else (topic,)
        if not topics:
            raise DefinitionError(f"agent {name!r} reads no topic: give it one or a list")
        names = [t if isinstance(t, str) else t.name for t in topics]
        if len(set(names)) < len(names):
            raise DefinitionError(f"agent {name!r} reads a topic twice: {names}")
        self.fn = fn
        self.name = name
        # Every topic the agent reads; ``topic`` is the first (where ``send`` goes).
        self.topics: tuple[Topic[Any] | str, ...] = topics
        self.topic: Topic[T] | str = topics[0]
        # ``stream.group_by`` and ``through`` calls in the body: (kind, name) -> the
        # topic of the hop (App.agent, see streams/hops.py).
        self.hops: dict[tuple[str, str], Topic[Any]] = {}
        self.join: Any = None  # the StreamJoin the agent reads (its two topics), if any
        self.sinks = tuple(sinks)
        self.concurrency = concurrency
        self.per_record = per_record
        self.internal = internal
        self.on_error = ErrorPolicy.of(on_error, f"agent {name!r}: on_error")
        self.dead_letter = dead_letter
        # APP_DEFAULT until the worker reads it: the app's guard then (``guard_in``).
        self.failure_guard: FailureGuard | None = (
            failure_guard
            if failure_guard is APP_DEFAULT
            else FailureGuard.of(failure_guard, f"agent {name!r}")
        )
        self.yields = is_gen
        self.is_async = is_coro
        # A per-record generator (a plain `def` that yields): several outputs per record.
        self.many = per_record and inspect.isgeneratorfunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Agent {self.name!r}>"

    @property
    def topic_name(self) -> str:
        """The name of the (first) topic the agent reads."""
        return self.topic if isinstance(self.topic, str) else self.topic.name

    @property
    def topic_names(self) -> list[str]:
        """The names of every topic the agent reads, in the order declared."""
        return [t if isinstance(t, str) else t.name for t in self.topics]

    @property
    def form(self) -> str:
        """``"stream"``, ``"per_record"``, or ``"repartition"`` for group_by's re-keyer."""
        if self.internal:
            return "repartition"
        return "per_record" if self.per_record else "stream"

    def guard_in(self, default: FailureGuard | None) -> FailureGuard | None:
        """The agent's ``FailureGuard``: its own, else ``default`` (the app's)."""
        return default if self.failure_guard is APP_DEFAULT else self.failure_guard

    def output_type(self) -> Any:
        """The declared output type from the function's annotations, or None.

        ``AsyncIterator[X]``/``AsyncGenerator[X, None]`` for the stream form, ``X`` or
        ``X | None`` for the per-record form and ``Iterator[X]`` for a per-record generator
        give ``X``.
        """
        try:
            hints = typing.get_type_hints(self.fn)
        except Exception:
            return None
        ret = hints.get("return")
        if ret is None or ret is type(None):
            return None
        origin = typing.get_origin(ret)
        if self.many:
            names = ("Iterator", "Generator", "Iterable")
            if origin is not None and getattr(origin, "__name__", "") in names:
                params = typing.get_args(ret)
                return params[0] if params else None
            return None
        if self.per_record:
            args = [a for a in typing.get_args(ret) if a is not type(None)]
            if typing.get_origin(ret) in (typing.Union, _UnionType) and len(args) == 1:
                return args[0]
            if typing.get_origin(ret) is None:
                return ret
            return None
        if origin is not None and getattr(origin, "__name__", "") in (
            "AsyncIterator",
            "AsyncGenerator",
            "AsyncIterable",
        ):
            params = typing.get_args(ret)
            return params[0] if params else None
        return None

    async def send(self, value: T, *, key: Any = None, headers: Headers = ()) -> Any:
        """Send ``value`` to this agent's input topic (its first, if it reads several),
        from inside a running worker."""
        if isinstance(self.topic, str):
            raise DefinitionError(f"agent {self.name!r} reads an undeclared topic")
        return await self.topic.send(value, key=key, headers=headers)


_UnionType = type(int | None)


TASK_ERROR_ACTIONS = ("stop", "restart", "ignore")


class Timer:
    """A function the worker calls every ``interval`` seconds, or once at start (a task).

    ``on_error`` says what an exception does: ``"stop"`` (the default: the worker stops
    with ``TaskFailed`` and exits non-zero), ``"restart"`` (logged, then run again after a
    backoff of 1 s doubling to 60 s; a timer simply fires again at its next tick) or
    ``"ignore"`` (logged; a task is not run again).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        interval: Seconds | None,
        on_error: str = "stop",
        cron: Cron | None = None,
        on_leader: bool = False,
    ) -> None:
        what = "timer" if interval is not None or cron is not None else "task"
        arguments.text(name, f"{what} name")
        arguments.flag(on_leader, f"{what} {name!r}: on_leader")
        if interval is not None:
            interval = seconds(interval, f"timer {name!r}: interval")
        if interval is not None and interval <= 0:
            raise DefinitionError(f"timer {name!r}: the interval must be > 0 seconds")
        if not inspect.iscoroutinefunction(fn):
            raise DefinitionError(f"{what} {name!r} must be async def")
        if on_error not in TASK_ERROR_ACTIONS:
            raise DefinitionError(
                f"{what} {name!r}: on_error must be 'stop', 'restart' or 'ignore', not {on_error!r}"
            )
        self.fn = fn
        self.name = name
        self.interval: float | None = interval
        self.on_error = on_error
        self.cron = cron
        self.on_leader = on_leader

    @property
    def kind(self) -> str:
        """``"timer"`` (by interval or crontab) or ``"task"``."""
        return "task" if self.interval is None and self.cron is None else "timer"

    def describe(self) -> dict[str, object]:
        """The schedule, as graph attributes."""
        attrs: dict[str, object] = {}
        if self.interval:
            attrs["interval"] = self.interval
        if self.cron is not None:
            attrs["crontab"] = f"{self.cron.expression} {self.cron.zone_name}"
        if self.on_leader:
            attrs["on_leader"] = True
        return attrs

    def __repr__(self) -> str:
        return f"<{self.kind.title()} {self.name!r}>"
