"""The runtime side of a stream: the batches queued for one agent instance, and the cursor.

``StreamSource`` is the one owner of the read position (which record of which batch is
current). The walkers of a batch (the compiled loop in ``_loop.py``, ``chunks`` here,
``hop`` and ``joined``) move it through its named operations, one way for all of them:
``next_batch``, ``begin`` or ``at``, ``refuse`` (a bad record dead-lettered in place),
``finish``. Everyone else asks: ``current_message()``, ``current_record()``, ``value``,
``event_time()``, ``retry_current()``, ``progress_of(batch)``. A source is also its agent
task's ``TaskScope``: tables reach the worker's state, and the record being processed,
through it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import DefinitionError
from ..records import Message, Origin, RawMessages, RawOrigin, TopicPartition
from ..scope import Sender, TaskScope
from ._loop import SKIP, call_loop, fused_loop, interpreted
from .batches import Barrier, Batch, BatchQueue
from .hops import HOP, hop
from .joining import joined

if TYPE_CHECKING:
    from ..clock import Clock
    from ..topics import Topic

__all__ = ["Emitting", "StreamSource"]


class Emitting(Protocol):
    """Where a per-record agent's outputs go (the worker's ``Emitter``): ``place`` puts a
    record's outputs in the publisher, ``settle`` waits for what it stopped for."""

    def place(self, outs: Any, cause: Any) -> Any: ...

    async def settle(self, wait: Any) -> None: ...


class StreamSource(TaskScope):
    """A bounded queue of batches and the read position of one agent instance.

    The position lives here, not in a generator, so that when an agent raises the worker
    knows which record failed and can start the agent again on the record after it.
    """

    def __init__(
        self,
        name: str,
        maxsize: int = 8,
        *,
        stores: dict[Any, Any] | None = None,
        sender: Sender | None = None,
        now_ms: Callable[[], int] = lambda: 0,
        clock: Clock | None = None,
        undecodable: Callable[[Exception], Awaitable[None]] | None = None,
        on_drained: Callable[[], None] | None = None,
        behind: Callable[[TopicPartition], bool] = lambda tp: False,
        hops: dict[tuple[str, str], Topic[Any]] | None = None,
        join: Any = None,
        exactly_once: bool = False,
        agent: str | None = None,
    ) -> None:
        super().__init__(stores={} if stores is None else stores, sender=sender, now_ms=now_ms)
        self.name = name
        self.agent = name if agent is None else agent  # the declared agent this instance runs
        self.clock = clock  # the worker's: take(within=) waits on it
        self._queue: BatchQueue = BatchQueue(maxsize)
        self.batch: Batch | None = None
        self._pos = -1
        # While the stream loop walks a batch, the position is its list iterator's (read
        # on demand, see ``pos()``): the loop then stores nothing per record to track it.
        self._it: Any = None
        self._n = 0
        self.closed = False
        self._held: deque[Batch] | None = None
        self.chunk: list[Message] | None = None  # records of the list batches() handed out
        self.value: Any = None  # the decoded value of the current record
        self.records = 0  # values handed to the agent
        # Of those, the records a hop sent on to its topic (group_by, through) rather than
        # to the agent: they come back as records of the hop topic (see ``reached``).
        self.passed = 0
        # The worker's: takes the error of a record that is bad input (the current one)
        # and deals with it (dead-letters it), so the stream goes on; or raises the error,
        # to go through the agent.
        self.undecodable = undecodable
        # Called when the agent has taken every queued batch and is about to wait for more.
        self.on_drained = on_drained
        # Windowed tables this agent adds to -> their store here: each finished batch moves
        # their stream time (filtered records too), see ``follow``.
        self.clocked: dict[Any, Any] = {}
        # The topics of the agent's ``stream.group_by`` and ``through`` calls (see hops.py).
        self.hops: dict[tuple[str, str], Topic[Any]] = {} if hops is None else hops
        self.join: Any = join  # the StreamJoin this agent reads, if any
        # A join's batches taken from the queue and not finished, per partition and side:
        # here, not in the generator, so that an agent started again after an error
        # goes on with them (see joining.py).
        self.join_held: dict[int, tuple[deque[Batch], deque[Batch]]] = {}
        # Whether a partition has records not fetched yet (the worker's fetcher knows).
        self.behind = behind
        self._parked = False  # waiting for records or the worker's clock, not real time
        # A barrier a join took from the queue with the batches before it (take_queued):
        # reached at its next wait for a batch, before anything queued after it is read.
        self._barrier: Barrier | None = None
        # Exactly-once only: per partition, the offset of the last record of the newest
        # batch taken from the queue, where a checkpoint cuts (see queue_barrier). None
        # otherwise: nothing is kept per batch that no one reads.
        self.taken: dict[TopicPartition, int] | None = {} if exactly_once else None

    # -- the cursor: the one way to walk a batch, and to ask where the walk is ------------
    #
    # A walker (the compiled loop, ``chunks``, ``hop``, ``joined``) takes a batch with
    # ``next_batch``, walks it with ``begin`` (the cursor follows an iterator) or ``at``
    # (the cursor set per record), hands a record that is bad input to ``refuse`` (dead-
    # lettered in place, the walk goes on) and ends the batch with ``finish``. Everyone
    # else asks: ``pos()``, ``current_message()``, ``current_record()``, ``event_time()``.

    def pos(self) -> int:
        """The index in ``batch.messages`` of the record being processed (-1: none yet).
        A method, not a property: a property's getter costs the interpreter a call through
        C, and a failed record asks this."""
        it = self._it
        if it is None:
            return self._pos
        # A walk by ``begin``: the iterator has handed out the records before its rest
        # (annotated, not converted: an int already, and read for every failed record).
        left: int = it.__length_hint__()
        return self._n - 1 - left

    def at(self, batch: Batch | None, i: int) -> None:
        """The cursor on record ``i`` of ``batch`` (-1: before its first; ``batch`` None:
        on no record). For a walker that steps by index (``chunks``, ``hop``, ``joined``)."""
        self.batch = batch
        self._it = None
        self._pos = i

    def begin(self, records: Sequence[Any]) -> Iterator[Any]:
        """Walk ``records`` (the current batch's ``messages`` or ``records``) from the
        cursor on: the iterator returned is the cursor, which stores nothing per record
        (``pos()`` reads the iterator when someone asks). Once per batch, and again for its
        rest when the agent is started again in the middle of it."""
        start = self.pos() + 1
        it = iter(records)
        if start:
            it.__setstate__(start)  # type: ignore[attr-defined]
        self._n = len(records)
        self._it = it
        return it

    def refuse(self, error: Exception) -> Awaitable[None]:
        """The current record failed where the walk found it (``error``: it does not
        decode, a join finds it late or beyond its guard, an operator of a list's chain
        raised on it): ``await source.refuse(error)`` deals with it there as the agent's
        error policy says for a record of a list (dead-lettered or skipped), and the walk
        goes on with the next record, the agent not started again for it. Raises ``error``
        where the worker wants it raised through the agent (a stop, ``fail_fast``, or no
        worker)."""
        undecodable = self.undecodable
        if undecodable is None:
            raise error from None
        # The worker's coroutine itself, awaited by the walker: no coroutine of our own
        # per bad record (a burst of them is all this path does).
        return undecodable(error)

    def finish(self, batch: Batch, *, passed: bool = False) -> None:
        """Every record of ``batch`` (the current one) is read: the cursor leaves it, and
        it is done (or held by the list being filled). ``passed``: a hop sent its records
        on to the hop topic rather than to the agent (see ``reached``)."""
        n = len(batch.messages)
        self.records += n
        if passed:
            self.passed += n
        self.batch = None
        self._it = None
        self._pos = -1
        if self.clocked:  # once per batch: stream time moves with every record read
            for table, store in self.clocked.items():
                table.follow(store, batch)
        if self._held is not None:
            self._held.append(batch)
        else:
            batch.on_done()

    def current_message(self) -> Message | None:
        """The message of the record the agent is processing, if any."""
        batch = self.batch
        if batch is None:
            return None
        pos = self.pos()
        messages = batch.messages
        if pos < 0 or pos >= len(messages):
            return None
        return messages[pos]

    def origin(self) -> object:
        """The record being processed as what caused a send (``topic.send`` in the agent):
        should the broker refuse the send, that record's error policy applies."""
        record = self.current_record()
        if record is None:
            return None
        assert self.batch is not None
        messages = self.batch.messages
        if isinstance(messages, RawMessages):
            return RawOrigin(record, self.agent, messages.convert)
        return Origin(record, self.agent)

    def current_record(self) -> Any:
        """The record the agent is processing as its batch holds it, if any: a
        ``Message``, or in a ``RawMessages`` batch the client's own record (its ``raw``
        item), which costs no ``Message`` to read."""
        batch = self.batch
        if batch is None:
            return None
        pos = self.pos()
        records = batch.records
        if pos < 0 or pos >= len(records):
            return None
        return records[pos]

    def event_time(self) -> int:
        """The timestamp (ms) of the record being processed."""
        messages = self.batch.messages  # type: ignore[union-attr]
        if messages.__class__ is RawMessages:  # read through the client: no Message made
            return int(messages.timestamp_of(messages.raw[self.pos()]))
        return int(messages[self.pos()].timestamp)

    def retry_current(self) -> None:
        """Step back one record: the agent, started again, gets the same record first."""
        if self.join is not None and self.batch is not None:
            self.batch.cursor -= 1  # a join keeps its place in the batch itself
            return
        self.at(self.batch, self.pos() - 1)

    def progress_of(self, batch: Batch) -> int | None:
        """The offset of the record being processed in ``batch`` (the ones before it are
        done), or None if that is not known (not started, or held by ``batches()``)."""
        if self.join is not None and self.batch is not batch:
            # A join holds batches side by side: one it is not reading now is done up to
            # its cursor (the next record to read).
            cursor = batch.cursor
            if cursor == 0:
                return None
            return batch.messages[min(cursor, len(batch.messages) - 1)].offset
        if self.batch is not batch or self._held is not None:
            return None
        pos = self.pos()
        if pos < 0:
            return None
        return batch.messages[pos].offset

    def reached(self) -> int:
        """How many records the stream has read for the agent, the current one included
        (filtered ones too, not those a hop sent on): one more per record. Asked when a
        record fails, so that two failures can be told apart from two with records between
        them, at no cost per record.

        >>> StreamSource("a").reached()
        0
        """
        held = self.join_held
        if held:  # a join's batches, side by side: each record read moves one cursor
            return self.records + sum(b.cursor for sides in held.values() for q in sides for b in q)
        return self.records - self.passed + self.pos() + 1

    def marker(self) -> tuple[int, int, Batch | None]:
        """Something that changes whenever the agent reads a record."""
        return (self.records, self.pos(), self.batch)

    # -- the worker's side ----------------------------------------------------------------

    async def put(self, batch: Batch) -> None:
        """Queue a batch; waits while the queue is full (backpressure on the fetcher)."""
        await self._queue.put(batch)

    def queue_barrier(self, barrier: Barrier, cut: dict[TopicPartition, int]) -> None:
        """Queue ``barrier`` behind the queued batches of each partition ``tp`` whose last
        record is at or before ``cut[tp]``, and ahead of every other batch (exactly-once:
        the agent finishes only what it must before the commit). Never waits."""

        def ahead(batch: Batch | None) -> bool:
            if batch is None:
                return False  # the close marker: after the barrier
            if not batch.messages:
                return True
            last = cut.get(batch.tp)
            return last is not None and batch.messages[-1].offset <= last

        self._queue.put_ahead(barrier, ahead)

    def close(self) -> None:
        """No more batches: the stream ends once the queued ones are processed."""
        if self.closed:
            return
        self.closed = True
        if not self._queue.full():  # wake a reader waiting on an empty queue
            self._queue.put_nowait(None)

    def parked(self) -> int:
        """Batches held by a ``take()`` list that waits for the worker's clock or for more
        records: the worker has nothing to do for them until either comes."""
        held = self._held
        return len(held) if self._parked and held is not None else 0

    def pending(self) -> int:
        """Batches queued and not yet taken."""
        return self._queue.qsize()

    @property
    def capacity(self) -> int:
        """How many batches the queue holds before ``put`` waits (0: no bound)."""
        return self._queue.maxsize

    def busy(self) -> bool:
        """True while a batch is being processed or waits in the queue (or in a join)."""
        if self.batch is not None or self._queue.qsize() > 0:
            return True
        return any(left or right for left, right in self.join_held.values())

    def ended(self) -> bool:
        """True once the source is closed and nothing is left to process."""
        return self.closed and not self.busy()

    # -- the stream's side: batches for the walkers ---------------------------------------

    def follow(self, table: Any, store: Any) -> None:
        """Every batch this agent finishes moves ``table``'s stream time."""
        self.clocked[table] = store

    async def next_batch(
        self, timeout: float | None = None, clock: Clock | None = None, filling: bool = False
    ) -> Batch | None:
        """The next batch, or None at the end of the stream (or on ``timeout`` seconds of
        ``clock``, else of the event loop, or at a barrier while ``filling`` a list)."""
        while True:
            if self._barrier is not None:
                barrier, self._barrier = self._barrier, None
                await self._reach(barrier)
            if self.closed and self._queue.empty():
                return None
            if self.on_drained is not None and self._queue.empty():
                self.on_drained()
            try:
                if timeout is None:
                    self._parked = True  # a held list waits for records: nothing to do
                    try:
                        batch = await self._queue.get()
                    finally:
                        self._parked = False
                elif clock is not None:
                    batch = await self._get_before(clock, timeout)
                else:
                    await asyncio.wait_for(self._queue.ready(), timeout)
                    batch = self._queue.get_nowait()  # in this task: see ``ready``
            except TimeoutError:
                return None
            if batch is None:
                if self.closed and self._queue.empty():
                    return None
                continue
            if not batch.messages:
                if batch.__class__ is Barrier:
                    if filling:
                        # An exactly-once commit: the list being filled (take(), batches())
                        # goes to the agent first, and the barrier is reached at the next
                        # wait, once every record before it is processed.
                        self._barrier = batch
                        return None
                    await self._reach(batch)
                    continue
                batch.on_done()
                continue
            self.at(batch, -1)
            if self.taken is not None:
                self.taken[batch.tp] = batch.messages[-1].offset
            return batch

    async def _reach(self, barrier: Barrier) -> None:
        # Batches a list loop holds with no value in the list (all filtered out) are done:
        # at a barrier no record before it may be left half-processed.
        held = self._held
        while held:
            held.popleft().on_done()
        await barrier.reached()

    def take_queued(self) -> list[Batch]:
        """The batches queued now, without waiting (a join looks at every one it has)."""
        out: list[Batch] = []
        queue = self._queue
        while not queue.empty() and self._barrier is None:
            batch = queue.get_nowait()
            if batch is None:
                continue  # the close marker: ``closed`` says it
            if not batch.messages:
                if isinstance(batch, Barrier):
                    self._barrier = batch  # nothing after it until it is reached
                    continue
                batch.on_done()
                continue
            if self.taken is not None:
                self.taken[batch.tp] = batch.messages[-1].offset
            out.append(batch)
        return out

    async def _get_before(self, clock: Clock, timeout: float) -> Batch | None:
        """The next queued item, unless ``timeout`` seconds of ``clock`` pass first."""
        ready = asyncio.ensure_future(self._queue.ready())
        sleep = asyncio.ensure_future(clock.sleep(timeout))
        self._parked = True
        try:
            await asyncio.wait((ready, sleep), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._parked = False
            sleep.cancel()
            if not ready.done():
                ready.cancel()
        if self._queue.empty():
            raise TimeoutError
        # Taken here, in the reader's task, not in the waiting one (see ``BatchQueue.ready``);
        # an item that arrived as the time ran out is taken too.
        return self._queue.get_nowait()

    def iterate(self, ops: tuple[tuple[str, Any], ...]) -> AsyncIterator[Any]:
        """Yield values from the current position on, applying ``ops`` lazily."""
        if self.join is not None:
            return joined(self, ops)
        if any(kind == HOP for kind, _ in ops):
            return hop(self, ops)
        loop, args = fused_loop(ops, self.stores)
        return loop(self, SKIP, *args)

    async def call_each(
        self,
        fn: Callable[[Any], Any],
        emitter: Emitting,
        failed: Callable[[Exception, Any], Awaitable[bool]],
        *,
        is_async: bool,
        many: bool,
    ) -> None:
        """Call ``fn`` on each value from the current position on, from inside the stream's
        loop (a per-record agent; see ``_loop.call_loop``): its outputs go to ``emitter``;
        when it raises, ``failed(exc, record)`` (the record as ``current_record()`` gives
        it) says whether the loop goes on."""
        place, settle = emitter.place, emitter.settle
        if self.join is None:
            await call_loop(is_async, many)(self, SKIP, fn, place, settle, failed)
            return
        async for value in self.iterate(()):  # a stream-stream join has a loop of its own
            try:
                out = fn(value)
                if is_async:
                    out = await out
                if out is None and not many:
                    continue
                outs = out if many else iter((out,))  # a generator's outputs as they come
                cause = self.current_record()
                wait = place(outs, cause)
                while wait is not None:
                    await settle(wait)
                    wait = place(outs, cause)
            except Exception as exc:
                if not await failed(exc, self.current_record()):
                    raise

    async def chunks(
        self,
        ops: tuple[tuple[str, Any], ...],
        max_size: int,
        within: float | None,
        clock: Clock | None = None,
    ) -> AsyncIterator[list[Any]]:
        """Yield lists of up to ``max_size`` values, waiting at most ``within`` seconds
        (None: for ever) for a list to fill, on ``clock`` (else the event loop's clock).
        Records of a list are done when the next list is requested."""
        if any(kind == HOP for kind, _ in ops):
            raise DefinitionError(
                "take() or batches() after group_by() or through() is not supported"
            )
        fn = interpreted(ops) if ops else None
        now = clock.monotonic if clock is not None else asyncio.get_running_loop().time
        forever = within is None
        self._held = deque()
        while True:
            chunk: list[Any] = []
            origins: list[Message] = []
            deadline = 0.0  # set when the list's first value arrives
            while len(chunk) < max_size:
                batch = self.batch
                if batch is None:
                    wait = None
                    if chunk and not forever:
                        wait = deadline - now()
                        if wait <= 0:
                            break
                    batch = await self.next_batch(wait, clock, filling=bool(chunk))
                    if batch is None:
                        break
                messages = batch.messages
                i = self.pos() + 1
                n = len(messages)
                while i < n and len(chunk) < max_size:
                    self.at(batch, i)
                    m = messages[i]
                    i += 1
                    try:
                        v = self.value = batch.decode(m.value)
                    except Exception as exc:
                        # Dead-lettered in place: the agent is not started again, and the
                        # list being filled keeps the values it has.
                        await self.refuse(batch.topic.decode_error(exc))
                        continue
                    if fn is not None:
                        try:
                            v = fn(v, batch.topic, m)
                        except Exception as exc:
                            # An operator raised: the record fails in place too, as one
                            # of a list (it cannot be processed again there).
                            await self.refuse(exc)
                            continue
                    if v is not SKIP:
                        if not chunk:
                            deadline = now() + (within or 0.0)
                        chunk.append(v)
                        origins.append(m)
                if i >= n:
                    self.finish(batch)
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
        held = self._held
        while held:
            held.popleft().on_done()
        self._held = None

    def holds_chunk(self) -> bool:
        """True while a ``batches()`` loop holds records (its list or its batches)."""
        return self.chunk is not None or self._held is not None
