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
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from ..durations import Seconds, seconds
from ..errors import DefinitionError
from ..records import Event
from ._loop import ECHO, EVENTS, FILTER, JOIN, MAP
from .hops import GROUP_BY, HOP, THROUGH, Hop
from .source import StreamSource

if TYPE_CHECKING:
    from ..topics import Topic

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

    def filter(self, predicate: Callable[[T], object]) -> Stream[T]:
        """Only the values for which ``predicate`` is true."""
        return Stream(self._source, (*self._ops, (FILTER, _unwrap(predicate))))

    def map(self, fn: Callable[[T], U]) -> Stream[U]:
        """Each value passed through ``fn``."""
        return Stream(self._source, (*self._ops, (MAP, _unwrap(fn))))

    def events(self) -> Stream[Event[T]]:
        """Each value in its envelope: key, headers, topic, partition, offset, timestamp."""
        return Stream(self._source, (*self._ops, (EVENTS, None)))

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
        if missing not in ("skip", "none", "error"):
            raise ValueError("missing must be 'skip', 'none' or 'error'")
        if not hasattr(table, "get"):  # a topic: that is a stream-stream join
            raise DefinitionError(
                f"stream.join({table!r}) joins a table; to join two topics within a time "
                "window, declare app.join(left, right, within=..., name=...) and read it "
                "with @app.agent(join)"
            )
        if isinstance(on, str):
            if not on.isidentifier():
                raise ValueError(f"join(on={on!r}): a field name must be an identifier")
            on = operator.attrgetter(on)
        return Stream(self._source, (*self._ops, (JOIN, (table, on, missing))))

    def group_by(
        self, key: Callable[[T], Any], *, name: str, partitions: int | None = None
    ) -> Stream[T]:
        """This stream re-keyed by ``key``, through the internal topic
        ``<app>-<name>-repartition``: each value goes there keyed by ``key(value)``, and
        the agent gets it back on the partition that owns the new key (so a table keyed
        by it is written on its own partition). One hop per record, at-least-once.

        Write the call in the agent's body with ``name=`` a string literal: the topic is
        declared with the agent. Only ``filter`` may come before it.
        """
        if not name:
            raise ValueError("group_by needs name=, the repartition topic's name")
        return Stream(self._source, (*self._ops, (HOP, Hop(GROUP_BY, name, key))))

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
        if not isinstance(name, str) or not name:
            raise ValueError(f"through() takes a topic or a topic name, not {topic!r}")
        return Stream(self._source, (*self._ops, (HOP, Hop(THROUGH, name))))

    def enumerate(self, start: int = 0) -> Stream[tuple[int, T]]:
        """Each value with its number: ``(start, v0), (start + 1, v1), ...``.

        Numbers count the values that reach this operator since the agent started (or
        started again after an error), as Python's ``enumerate`` and Faust's do; they are
        not offsets (``events()`` has those).
        """
        counter = itertools.count(start)
        return self.map(lambda v: (next(counter), v))

    def echo(self, *topics: Topic[Any]) -> Stream[T]:
        """The same values, each also sent to every one of ``topics`` first (Faust's
        ``echo``): with the record's key, encoded with each topic's codec.

        Delivery: each copy is queued before the agent gets the value, and acknowledged by
        the broker before the offset of its record is committed; after a crash, the
        records since the last commit are echoed again (at-least-once).
        """
        if not topics or not all(hasattr(t, "encode") for t in topics):
            raise ValueError("echo() takes one or more topics declared with app.topic()")
        return Stream(self._source, (*self._ops, (ECHO, _echo_to(topics))))

    def take(self, max_: int, within: Seconds | None = None) -> AsyncIterator[list[T]]:
        """Lists of up to ``max_`` values (Faust's ``take``): a list is yielded when it is
        full, or ``within`` seconds (or a ``timedelta``) after its first value arrived,
        on the worker's clock (a ``FakeClock`` in tests). Without ``within``, every list
        waits until it is full.

        Delivery: the records of a list are done (committable) when the agent asks for
        the next list; if the loop body raises, every record of the list is dead-lettered.
        """
        limit = None if within is None else seconds(within, "take(within=)")
        if max_ < 1 or (limit is not None and limit < 0):
            raise ValueError("take() needs max_ >= 1 and within >= 0")
        self._no_echo("take()")
        return self._source.chunks(self._ops, max_, limit, self._source.clock)

    def _no_echo(self, what: str) -> None:
        if any(kind == ECHO for kind, _ in self._ops):
            raise ValueError(
                f"echo() cannot come before {what}: echo each list's values in the loop"
            )

    def batches(self, max_size: int, within_seconds: Seconds) -> AsyncIterator[list[T]]:
        """Lists of up to ``max_size`` values, each waiting at most ``within_seconds``
        (seconds or a ``datetime.timedelta``).

        The records of a list are done (committable) when the next list is requested.
        """
        within = seconds(within_seconds, "batches(within_seconds=)")
        if max_size < 1 or within < 0:
            raise ValueError("batches() needs max_size >= 1 and within_seconds >= 0")
        self._no_echo("batches()")
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
