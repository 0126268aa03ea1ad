"""Streams: what an agent iterates.

The worker hands each agent instance a ``Stream``. Records arrive as whole fetched batches
(one per partition fetch); the stream yields their values one at a time and reports a batch
*done* when the agent asks for the record after its last one. That is the Faust contract,
"moving to the next record marks the previous one done", kept batch-shaped: there is no
per-record queue, lock or callback.

Operators (``filter``, ``map``, ``events``, ``join``, ``group_by``, ``through``, ``take``,
``batches``, ...) return
new streams over the same source, so an agent can write
``async for v in stream.filter(pred)``. They run lazily, one record at a time, in the
agent's task: a predicate sees the table state the previous record left behind.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar, cast, overload

from .. import arguments
from ..durations import Seconds
from ..errors import DefinitionError
from ..records import Event
from ..topics import Topic
from ._loop import ECHO, EVENTS, FILTER, JOIN, MAP
from .hops import GROUP_BY, HOP, THROUGH, Hop, split
from .source import StreamSource

__all__ = ["Stream"]

T = TypeVar("T")
U = TypeVar("U")


def _unwrap(fn: Any) -> Any:
    # flowkit.Filter and Transform are functools.partial objects around generated code:
    # calling the code directly saves a wrapper call per record.
    if isinstance(fn, functools.partial) and not fn.args and not fn.keywords:
        return fn.func
    return fn


class Stream(Generic[T]):
    """An async iterable of values, handed to an agent by the worker::

        @app.agent(orders, sink=[big_orders])
        async def big(stream: flowkit.Stream[Order]):
            async for order in stream.filter(lambda o: o.amount > 100):
                yield order

    ``tests/test_agents.py`` runs every operator end to end.
    """

    def __init__(self, source: StreamSource, ops: tuple[tuple[str, Any], ...] = ()) -> None:
        self._source = source
        self._ops = ops

    def __aiter__(self) -> AsyncIterator[T]:
        return cast("AsyncIterator[T]", self._source.iterate(self._ops))

    def _then(self, kind: str, arg: Any) -> Stream[Any]:
        # The chain with one more operator. Its order is checked here, when the agent
        # calls the operator, not when the first record reaches it.
        ops = (*self._ops, (kind, arg))
        if kind == HOP or any(k == HOP for k, _ in self._ops):
            split(ops)
        return Stream(self._source, ops)

    def filter(self, predicate: Callable[[T], object]) -> Stream[T]:
        """Only the values for which ``predicate`` is true."""
        arguments.function(predicate, "stream.filter(): predicate")
        return self._then(FILTER, _unwrap(predicate))

    def map(self, fn: Callable[[T], U]) -> Stream[U]:
        """Each value passed through ``fn``."""
        arguments.function(fn, "stream.map(): fn")
        return self._then(MAP, _unwrap(fn))

    def events(self) -> Stream[Event[T]]:
        """Each value in its envelope: key, headers, topic, partition, offset, timestamp."""
        return self._then(EVENTS, None)

    def join(
        self, table: Any, on: Callable[[T], Any] | str, *, missing: str = "skip"
    ) -> Stream[tuple[T, Any]]:
        """Each value with its match in ``table``: ``(value, table[on(value)])``.

        ``on`` is a function of the value, or the name of the value's field that holds
        the key (``on="ad_id"``: read in C, without a Python call per record).
        ``missing`` says what a value without a match does: ``"skip"`` (dropped, the
        default), ``"none"`` (paired with None) or ``"error"`` (raises ``KeyError``, so
        the record goes to the dead-letter topic).
        """
        if not hasattr(table, "get"):  # a topic: that is a stream-stream join
            raise DefinitionError(
                f"stream.join() joins a table, not {arguments.shown(table)}; to join two "
                "topics within a time window, declare app.join(left, right, within=..., "
                "name=...) and read it with @app.agent(join)"
            )
        arguments.choice(missing, "stream.join(): missing", ("skip", "none", "error"))
        if isinstance(on, str):
            if not on.isidentifier():
                raise DefinitionError(f"stream.join(): on={on!r} is not a field name")
            on = operator.attrgetter(on)
        elif not callable(on):
            raise DefinitionError(
                f"stream.join(): on must be a function or a field name, not {arguments.shown(on)}"
            )
        return self._then(JOIN, (table, on, missing))

    def group_by(
        self, key: Callable[[T], Any], *, name: str = "", partitions: int | None = None
    ) -> Stream[T]:
        """This stream re-keyed by ``key``, through the internal topic
        ``<app>-<name>-repartition``: each value goes there keyed by ``key(value)``, and
        the agent gets it back on the partition that owns the new key (so a table keyed
        by it is written on its own partition). One hop per record, at-least-once.

        Write the call in the agent's body with ``name=`` a string literal: the topic is
        declared with the agent. Only ``filter`` may come before it.
        """
        if not name:
            raise DefinitionError(
                "stream.group_by() needs name=, the repartition topic's name (a string literal)"
            )
        arguments.function(key, "stream.group_by(): key")
        arguments.name(name, "stream.group_by(): name")
        arguments.optional_count(partitions, "stream.group_by(): partitions")
        return self._then(HOP, Hop(GROUP_BY, name, key))

    @overload
    def through(self, topic: Topic[U]) -> Stream[U]: ...
    @overload
    def through(self, topic: str) -> Stream[Any]: ...
    def through(self, topic: Topic[Any] | str) -> Stream[Any]:
        """This stream moved onto ``topic`` (Faust's ``through``): each value is sent
        there, with its record's key, headers and timestamp and encoded with the topic's
        codec, and the agent gets the values that come back from ``topic``, on the
        partitions its instance owns (so partitioned by key over ``topic``'s partition
        count). Records that other writers send to ``topic`` come too.

        ``topic`` is a topic declared with ``app.topic()`` or its name. Write the call in
        the agent's body, naming a module-level topic or a string literal: the agent
        reads the topic from the start, so it is found when the agent is declared. Only
        ``filter`` and ``map`` may come before it.

        Delivery: a record's offset is committed once its forwarded copy is acknowledged;
        after a crash, the records since the last commit are forwarded again
        (at-least-once).
        """
        name = topic if isinstance(topic, str) else getattr(topic, "name", None)
        if not isinstance(topic, Topic | str) or not name:
            raise DefinitionError(
                f"stream.through() takes a topic or a topic name, not {arguments.shown(topic)}"
            )
        return self._then(HOP, Hop(THROUGH, name))

    def enumerate(self, start: int = 0) -> Stream[tuple[int, T]]:
        """Each value with its number: ``(start, v0), (start + 1, v1), ...``.

        Numbers count the values that reach this operator since the agent started (or
        started again after an error), as Python's ``enumerate`` and Faust's do; they are
        not offsets (``events()`` has those).
        """
        if not isinstance(start, int) or isinstance(start, bool):
            raise DefinitionError(
                f"stream.enumerate(): start must be an int, not {arguments.shown(start)}"
            )
        counter = itertools.count(start)
        return self.map(lambda v: (next(counter), v))

    def echo(self, *topics: Topic[Any]) -> Stream[T]:
        """The same values, each also sent to every one of ``topics`` first (Faust's
        ``echo``): with the record's key, encoded with each topic's codec.

        Delivery: each copy is queued before the agent gets the value, and acknowledged by
        the broker before the offset of its record is committed; after a crash, the
        records since the last commit are echoed again (at-least-once).
        """
        if not topics:
            raise DefinitionError(
                "stream.echo() takes one or more topics declared with app.topic()"
            )
        for topic in topics:
            if not isinstance(topic, Topic):
                raise DefinitionError(
                    "stream.echo() takes topics declared with app.topic(), not "
                    f"{arguments.shown(topic)}"
                )
        if self._source.join is not None:
            raise DefinitionError(
                "stream.echo() does not work on a join's stream: send the copies in the loop"
            )
        return self._then(ECHO, _echo_to(topics))

    def take(self, max_: int, within: Seconds | None = None) -> AsyncIterator[list[T]]:
        """Lists of up to ``max_`` values (Faust's ``take``): a list is yielded when it is
        full, or ``within`` seconds (or a ``timedelta``) after its first value arrived,
        on the worker's clock (a ``FakeClock`` in tests). Without ``within``, every list
        waits until it is full.

        Delivery: the records of a list are done (committable) when the agent asks for
        the next list; if the loop body raises, every record of the list is dead-lettered.
        """
        arguments.count(max_, "stream.take(): max_")
        limit = None
        if within is not None:
            limit = arguments.non_negative_seconds(within, "stream.take(): within")
        self._listable("take()")
        return self._source.chunks(self._ops, max_, limit, self._source.clock)

    def _listable(self, what: str) -> None:
        # What may come before take() and batches(): checked when they are called.
        kinds = {kind for kind, _ in self._ops}
        if ECHO in kinds:
            raise DefinitionError(
                f"stream.echo() cannot come before {what}: echo each list's values in the loop"
            )
        if HOP in kinds:
            raise DefinitionError(f"stream.{what} after group_by() or through() is not supported")
        if self._source.join is not None:
            raise DefinitionError(f"stream.{what} does not work on a join's stream")

    def batches(self, max_size: int, within_seconds: Seconds) -> AsyncIterator[list[T]]:
        """Lists of up to ``max_size`` values, each waiting at most ``within_seconds``
        (seconds or a ``datetime.timedelta``).

        The records of a list are done (committable) when the next list is requested.
        """
        arguments.count(max_size, "stream.batches(): max_size")
        within = arguments.non_negative_seconds(within_seconds, "stream.batches(): within_seconds")
        self._listable("batches()")
        return self._source.chunks(self._ops, max_size, within)

    @property
    def current(self) -> Event[Any] | None:
        """The envelope of the record being processed now (None between records)."""
        source = self._source
        message = source.current_message()
        if message is None or source.batch is None:
            return None
        return source.batch.topic.event(message, source.value)


def _echo_to(topics: tuple[Topic[Any], ...]) -> Callable[..., Any]:
    async def echo(source: StreamSource, value: Any, message: Any) -> None:
        send = source.sender.send_bytes  # type: ignore[union-attr]
        for topic in topics:
            await send(topic.name, topic.encode(value), key=message.key)

    return echo
