"""Streams: what an agent iterates.

The worker hands each agent instance a ``Stream``. Records arrive as whole fetched batches
(one per partition fetch); the stream yields their values one at a time and reports a batch
*done* when the agent asks for the record after its last one. That is the Faust contract,
"moving to the next record marks the previous one done", kept batch-shaped: there is no
per-record queue, lock or callback.

Operators (``filter``, ``map``, ``events``, ``batches``) return new streams over the same
source, so an agent can write ``async for v in stream.filter(pred)``. They run lazily, one
record at a time, in the agent's task: a predicate sees the table state the previous record
left behind.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import operator
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from .operators import EVENTS, FILTER, JOIN, MAP, SKIP, fused_loop
from .records import Event, Message, TopicPartition

if TYPE_CHECKING:
    from .topics import Topic

__all__ = ["Batch", "Stream", "StreamSource", "active_source", "bind_source"]

T = TypeVar("T")
U = TypeVar("U")

_SKIP = SKIP
_FILTER = FILTER
_MAP = MAP
_EVENTS = EVENTS
_JOIN = JOIN


_ACTIVE: contextvars.ContextVar[StreamSource | None] = contextvars.ContextVar(
    "flowkit_active_source", default=None
)


def bind_source(source: StreamSource) -> None:
    """Mark ``source`` as the stream of the current agent task (set once per task)."""
    _ACTIVE.set(source)


# ``active_source()``: the stream the current agent task iterates, or None outside an agent.
# Tables use it for the ``table[key] += 1`` sugar and ``add()`` without ``ts=``: the partition
# and time of the record being processed come from the agent's own stream, never from a
# global. It is the context variable's own ``get`` (no Python frame: tables call it per record).
active_source: Callable[[], StreamSource | None] = _ACTIVE.get


class Batch:
    """One fetched batch of one partition, decoded, on its way through one agent instance."""

    __slots__ = ("decode", "messages", "on_done", "topic", "tp")

    def __init__(
        self,
        topic: Topic[Any],
        tp: TopicPartition,
        messages: list[Message],
        on_done: Callable[[], None],
    ) -> None:
        self.topic = topic
        self.tp = tp
        self.messages = messages
        self.decode = topic.decoder()
        self.on_done = on_done


class StreamSource:
    """The runtime side of a stream: a bounded queue of batches and the read position.

    The position lives here, not in a generator, so that when an agent raises the worker
    knows which record failed and can start the agent again on the record after it.
    """

    def __init__(self, name: str, maxsize: int = 8) -> None:
        self.name = name
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize)
        self.batch: Batch | None = None
        self._pos = -1
        # While the stream loop walks a batch, the position is its list iterator's (read
        # on demand, see ``pos``): the loop then stores nothing per record to track it.
        self._it: Any = None
        self._n = 0
        self.closed = False
        self._held: deque[Batch] | None = None
        self.chunk: list[Message] | None = None  # records of the list batches() handed out
        self.value: Any = None  # the decoded value of the record at ``pos``
        self.records = 0  # values handed to the agent
        # Called when the agent has taken every queued batch and is about to wait for more.
        self.on_drained: Callable[[], None] | None = None

    @property
    def pos(self) -> int:
        """The index in ``batch.messages`` of the record being processed (-1: none yet)."""
        it = self._it
        if it is None:
            return self._pos
        return self._n - 1 - int(it.__length_hint__())

    @pos.setter
    def pos(self, value: int) -> None:
        self._it = None
        self._pos = value

    # -- the worker's side ----------------------------------------------------------------

    async def put(self, batch: Batch) -> None:
        """Queue a batch; waits while the queue is full (backpressure on the fetcher)."""
        await self._queue.put(batch)

    def close(self) -> None:
        """No more batches: the stream ends once the queued ones are processed."""
        if self.closed:
            return
        self.closed = True
        if not self._queue.full():  # wake a reader waiting on an empty queue
            self._queue.put_nowait(None)

    def pending(self) -> int:
        """Batches queued and not yet taken."""
        return self._queue.qsize()

    def busy(self) -> bool:
        """True while a batch is being processed or waits in the queue."""
        return self.batch is not None or self._queue.qsize() > 0

    def progress_of(self, batch: Batch) -> int | None:
        """The offset of the record being processed in ``batch`` (the ones before it are
        done), or None if that is not known (not started, or held by ``batches()``)."""
        if self.batch is not batch or self._held is not None or self.pos < 0:
            return None
        return batch.messages[self.pos].offset

    def current_message(self) -> Message | None:
        """The message of the record the agent is processing, if any."""
        batch = self.batch
        if batch is None or not 0 <= self.pos < len(batch.messages):
            return None
        return batch.messages[self.pos]

    # -- the stream's side ----------------------------------------------------------------

    def _finish(self, batch: Batch) -> None:
        self.batch = None
        self.pos = -1
        if self._held is not None:
            self._held.append(batch)
        else:
            batch.on_done()

    def _release_held(self) -> None:
        held = self._held
        if held:
            while held:
                held.popleft().on_done()

    async def _next_batch(self, timeout: float | None = None) -> Batch | None:
        """The next batch, or None at the end of the stream (or on ``timeout``)."""
        while True:
            if self.closed and self._queue.empty():
                return None
            if self.on_drained is not None and self._queue.empty():
                self.on_drained()
            try:
                if timeout is None:
                    batch = await self._queue.get()
                else:
                    batch = await asyncio.wait_for(self._queue.get(), timeout)
            except TimeoutError:
                return None
            if batch is None:
                if self.closed and self._queue.empty():
                    return None
                continue
            if not batch.messages:
                batch.on_done()
                continue
            self.batch = batch
            self.pos = -1
            return batch

    def iterate(self, ops: tuple[tuple[str, Any], ...]) -> AsyncIterator[Any]:
        """Yield values from the current position on, applying ``ops`` lazily."""
        loop, args = fused_loop(ops)
        return loop(self, _SKIP, *args)

    async def chunks(
        self, ops: tuple[tuple[str, Any], ...], max_size: int, within: float
    ) -> AsyncIterator[list[Any]]:
        """Yield lists of up to ``max_size`` values, waiting at most ``within`` seconds
        for a list to fill. Records of a list are done when the next list is requested."""
        fn = _compose(ops) if ops else None
        self._held = deque()
        while True:
            chunk: list[Any] = []
            origins: list[Message] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            while len(chunk) < max_size:
                batch = self.batch
                if batch is None:
                    left = deadline - loop.time()
                    if left <= 0 and chunk:
                        break
                    batch = await self._next_batch(max(left, 0.0) if chunk else None)
                    if batch is None:
                        break
                messages = batch.messages
                i = self.pos + 1
                n = len(messages)
                self._it = None  # the position is _pos here, set per record
                while i < n and len(chunk) < max_size:
                    self._pos = i
                    try:
                        v = self.value = batch.decode(messages[i].value)
                    except Exception as exc:
                        raise batch.topic.decode_error(exc) from None
                    if fn is not None:
                        v = fn(v, batch, i)
                    if v is not _SKIP:
                        chunk.append(v)
                        origins.append(batch.messages[i])
                    i += 1
                if i >= n:
                    self.records += n
                    self._finish(batch)
            if not chunk:
                if self.closed and self._queue.empty() and self.batch is None:
                    self.release_chunk()
                    return
                continue
            # Until the next list is asked for, these records are the agent's: if it
            # raises, the worker dead-letters all of them (see release_chunk).
            self.chunk = origins
            yield chunk
            self.release_chunk()
            self._held = deque()

    def release_chunk(self) -> None:
        """The records of the last ``batches()`` list are done (or dead-lettered)."""
        self.chunk = None
        self._release_held()
        self._held = None


def _compose(ops: tuple[tuple[str, Any], ...]) -> Callable[[Any, Batch, int], Any]:
    """Fold operators into one function of (value, batch, index) -> value or _SKIP."""
    steps = list(ops)

    def apply(v: Any, batch: Batch, i: int) -> Any:
        for kind, fn in steps:
            if kind == _FILTER:
                if not fn(v):
                    return _SKIP
            elif kind == _MAP:
                v = fn(v)
            elif kind == _JOIN:
                table, on, missing = fn
                match = table.get(on(v), _SKIP)
                if match is _SKIP:
                    if missing == "skip":
                        return _SKIP
                    if missing == "error":
                        raise KeyError(f"no {on(v)!r} in table {table.name!r} (join)")
                    match = None
                v = (v, match)
            else:  # events: wrap the value in its envelope
                v = batch.topic.event(batch.messages[i], v)
        return v

    return apply


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
        return Stream(self._source, (*self._ops, (_FILTER, _unwrap(predicate))))

    def map(self, fn: Callable[[T], U]) -> Stream[U]:
        """Each value passed through ``fn``."""
        return Stream(self._source, (*self._ops, (_MAP, _unwrap(fn))))

    def events(self) -> Stream[Event[T]]:
        """Each value in its envelope: key, headers, topic, partition, offset, timestamp."""
        return Stream(self._source, (*self._ops, (_EVENTS, None)))

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
        if isinstance(on, str):
            if not on.isidentifier():
                raise ValueError(f"join(on={on!r}): a field name must be an identifier")
            on = operator.attrgetter(on)
        return Stream(self._source, (*self._ops, (_JOIN, (table, on, missing))))

    def batches(self, max_size: int, within_seconds: float) -> AsyncIterator[list[T]]:
        """Lists of up to ``max_size`` values, each waiting at most ``within_seconds``.

        The records of a list are done (committable) when the next list is requested.
        """
        if max_size < 1 or within_seconds < 0:
            raise ValueError("batches() needs max_size >= 1 and within_seconds >= 0")
        return self._source.chunks(self._ops, max_size, within_seconds)

    @property
    def current(self) -> Event[Any] | None:
        """The envelope of the record being processed now (None between records)."""
        batch = self._source.batch
        message = self._source.current_message()
        if batch is None or message is None:
            return None
        return batch.topic.event(message, self._source.value)
