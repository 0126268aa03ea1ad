"""``RdkafkaConsumer``: a librdkafka consumer behind the ``Consumer`` protocol.

librdkafka fetches in its own threads; ``consume`` only takes what it has queued, but it
blocks while it waits, and rebalance callbacks run inside it. So each consumer has one
thread of its own that runs ``consume`` (one call per ``getmany``, a whole batch back to
the event loop) and the callbacks; the callbacks hand the listener over to the loop and
wait for it, so the listener still runs "inside ``getmany``" as the protocol says.

Positions are flowkit's own: every partition starts at an offset resolved when it is
assigned (the committed one, else the reset policy's end, looked up once), so ``position``
is known as soon as ``highwater`` is, and moves with the records ``getmany`` returns.

Under exactly-once a ``getmany`` hands over at most ``max_partition_fetch_bytes`` of each
partition (see ``batches.Held``): librdkafka reads far ahead of the agents, and a checkpoint's
transaction stays open until the agents have processed every batch handed to them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import confluent_kafka as ck
import structlog

from ...errors import CommitFailed, ConfigurationError, TransportError
from ...records import Message, RawMessages, TopicPartition
from ..base import OffsetReset, RebalanceListener
from .batches import Held, batches_of, runs_of
from .errors import RDKAFKA_ERRORS, map_rdkafka_errors, translate

if TYPE_CHECKING:
    from .transport import RdkafkaTransport

__all__ = ["RdkafkaConsumer"]

log = structlog.get_logger(__name__)
T = TypeVar("T")

_SLICE = 0.1  # seconds a waiting consume blocks before it looks for aclose()
# What the consume thread hands over: start offsets it resolved, records, high watermarks,
# and librdkafka's positions of the partitions whose records were all handed over.
_Batch = tuple[
    dict[TopicPartition, int],
    dict[TopicPartition, RawMessages],
    dict[TopicPartition, int],
    dict[TopicPartition, int],
]


class RdkafkaConsumer:
    """A ``confluent_kafka.Consumer`` behind the ``Consumer`` protocol (auto-commit off).

    The client is made in ``start`` or by the first ``getmany``/``commit``; ``subscribe``
    and ``assign`` called before that take effect then. Closing leaves the group without
    a revocation callback: commit before ``aclose``.
    """

    def __init__(
        self,
        transport: RdkafkaTransport,
        config: dict[str, Any],
        group_id: str | None,
        auto_offset_reset: OffsetReset,
        budget: int | None = None,
    ) -> None:
        self._transport = transport
        self._config = config
        self._group_id = group_id
        self._reset = auto_offset_reset
        self._kafka: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="flowkit-rdkafka-consumer"
        )
        self._topics: list[str] | None = None
        self._listener: RebalanceListener | None = None
        self._owned: set[TopicPartition] = set()
        self._positions: dict[TopicPartition, int] = {}
        # The group metadata a transactional producer sends with its offsets, read in the
        # consume thread after each rebalance (see group_metadata).
        self._group_meta: Any = None
        self._meta_stale = True
        self._lost = False  # partitions lost since lost_partitions() last said so
        # High watermarks as of the last batch, read by the consume thread: the loop
        # never calls into librdkafka for them (a call there can wait on a lock that a
        # rebalance callback in the consume thread holds).
        self._highs: dict[TopicPartition, int] = {}
        # assign() not yet applied by the consume thread: partition -> kept position.
        self._wanted: dict[TopicPartition, int | None] | None = None
        self._wanted_lock = threading.Lock()
        self._ktps: dict[TopicPartition, Any] = {}
        # Records consumed but not handed over yet, when a getmany is held to ``budget``
        # bytes a partition (exactly-once): only the consume thread touches it.
        self._held = Held(budget) if budget is not None else None
        self._inflight: asyncio.Future[_Batch] | None = None
        self._fatal: TransportError | None = None
        self._closed = False
        # While a rebalance callback waits for the listener, calls the listener makes
        # (commit) run in the consume thread: librdkafka does not answer a commit made
        # from another thread during the callback.
        self._in_callback = False
        # The rebalance callback's coroutine that the consume thread waits for, if any.
        self._callback: concurrent.futures.Future[Any] | None = None
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._calls = queue.SimpleQueue()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (``BrokerUnavailable`` after ``connect_timeout``); a group member joins
        in ``getmany``."""
        if self._kafka is not None:
            return
        if self._closed:
            raise TransportError("this Kafka consumer is closed")
        self._loop = asyncio.get_running_loop()
        kafka = ck.Consumer({**self._config, "error_cb": self._on_error})
        try:
            await self._transport.connect(kafka)
        except BaseException:
            await self._loop.run_in_executor(self._thread, kafka.close)
            raise
        self._kafka = kafka
        if self._topics is not None:
            self._subscribe(kafka)

    def _on_error(self, error: Any) -> None:
        # librdkafka reports connection trouble here and retries by itself; only a fatal
        # error ends the consumer.
        if error.fatal():
            self._fatal = translate(ck.KafkaException(error))
        elif not self._closed:
            log.debug("Kafka client error", error=error.str())
            self._transport.on_error(error)  # a lost connection: the broker watch checks

    async def aclose(self) -> None:
        """Leave the group and disconnect; a ``getmany`` waiting in another task returns {}."""
        if self._closed:
            return
        self._closed = True
        self._transport.forget(self)
        inflight = self._inflight
        if inflight is not None:
            # It ends within _SLICE (it sees _closed), unless it runs a rebalance callback
            # that waits for a lost broker (a revocation's commit): that is given up after
            # the transport's closing limit, as the worker gives up its commits.
            limit = self._transport.closing_limit()
            await asyncio.wait([inflight], timeout=limit)
            if not inflight.done():
                log.warning("a Kafka client did not close while the broker is away", limit=limit)
                callback = self._callback
                if callback is not None:
                    callback.cancel()
                await asyncio.wait([inflight])
            if not inflight.cancelled():
                inflight.exception()  # a batch nobody will read; its error is moot too
        kafka, self._kafka = self._kafka, None
        if kafka is not None:
            loop = asyncio.get_running_loop()
            with map_rdkafka_errors():
                await loop.run_in_executor(self._thread, kafka.close)
        self._thread.shutdown(wait=False)

    # -- assignment ---------------------------------------------------------------------

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the consumer group for ``topics``; ``listener`` hears of every change."""
        if self._group_id is None:
            raise ConfigurationError("subscribe() needs a consumer with a group_id")
        self._topics, self._listener = list(topics), listener
        if self._kafka is not None:
            self._subscribe(self._kafka)

    def _subscribe(self, kafka: Any) -> None:
        with map_rdkafka_errors():
            kafka.subscribe(
                self._topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions; those kept from the last call keep their position."""
        if self._listener is not None:
            raise ConfigurationError("assign() on a consumer that subscribed to a group")
        wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}
        self._owned = set(wanted)
        self._positions = {tp: p for tp, p in self._positions.items() if tp in wanted}
        with self._wanted_lock:
            self._wanted = {tp: self._positions.get(tp) for tp in wanted}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` (assigned with ``assign``) from ``offset`` on (reset as
        ``auto.offset.reset`` says if outside the log), from the next ``getmany``."""
        if tp not in self._owned:
            raise TransportError(f"{tp.topic}[{tp.partition}] is not assigned to this consumer")
        self._positions[tp] = offset
        with self._wanted_lock:
            self._wanted = {t: self._positions.get(t) for t in self._owned}

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now (as last told to the listener)."""
        return set(self._owned)

    def _ktp(self, tp: TopicPartition) -> Any:
        ktp = self._ktps.get(tp)
        if ktp is None:
            ktp = self._ktps[tp] = ck.TopicPartition(tp.topic, tp.partition)
        return ktp

    def _starts(self, kafka: Any, tps: list[TopicPartition], committed: bool) -> dict[Any, int]:
        # In the consume thread: where each partition starts, the committed offset or
        # else the end the reset policy names (a listed offset, not a lazy "beginning",
        # so the position is a number from the start).
        timeout = self._transport.connect_timeout
        starts: dict[TopicPartition, int] = {}
        if committed and tps:
            for k in kafka.committed([self._ktp(tp) for tp in tps], timeout=timeout):
                if k.offset >= 0:
                    starts[TopicPartition(k.topic, k.partition)] = k.offset
        end = 0 if self._reset == "earliest" else 1
        for tp in tps:
            if tp not in starts:
                starts[tp] = int(_watermarks(kafka, self._ktp(tp), timeout)[end])
        return starts

    def _on_assign(self, kafka: Any, partitions: list[Any]) -> None:
        if self._closed:
            return
        self._meta_stale = True
        tps = [TopicPartition(k.topic, k.partition) for k in partitions]
        if self._held is not None:  # read again from the committed offsets
            self._held.drop(tps)
        starts = self._starts(kafka, tps, committed=True)
        kafka.assign([ck.TopicPartition(tp.topic, tp.partition, o) for tp, o in starts.items()])
        self._in_loop(self._assigned(starts))

    def _on_lost(self, kafka: Any, partitions: list[Any]) -> None:
        # The group went on without this member (it missed its session: paused, or stuck):
        # its partitions may be another member's already. Told as a revocation, and noted
        # for the transaction that was open meanwhile (``lost_partitions``).
        if partitions:
            self._lost = True
        self._on_revoke(kafka, partitions)

    def lost_partitions(self) -> bool:
        """True once if this member lost partitions to the group (rather than giving them
        up in a rebalance) since the last call: an exactly-once transaction open across
        that must not commit, since another member may have processed its records."""
        lost, self._lost = self._lost, False
        return lost

    def _on_revoke(self, kafka: Any, partitions: list[Any]) -> None:
        if self._held is not None:
            self._held.drop(TopicPartition(k.topic, k.partition) for k in partitions)
        if not self._closed and partitions:
            self._in_loop(self._revoked({TopicPartition(k.topic, k.partition) for k in partitions}))

    async def _assigned(self, starts: dict[TopicPartition, int]) -> None:
        self._positions.update(starts)
        self._owned = set(starts)
        if self._listener is not None:
            await self._listener.on_partitions_assigned(set(starts))

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        self._owned = self._owned - revoked  # a new set: the consume thread reads the old one
        try:
            if self._listener is not None:
                await self._listener.on_partitions_revoked(revoked)
        finally:
            for tp in revoked:
                self._positions.pop(tp, None)

    def _in_loop(self, coro: Coroutine[Any, Any, T]) -> T | None:
        # From the consume thread: run ``coro`` on the event loop and wait for it, running
        # the calls it hands to this thread meanwhile.
        loop = self._loop
        assert loop is not None
        self._in_callback = True
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
            self._callback = future
            while not future.done():
                try:
                    call, result = self._calls.get(timeout=0.02)
                except queue.Empty:
                    if loop.is_closed():
                        future.cancel()
                        return None
                    continue
                try:
                    result.set_result(call())
                except BaseException as exc:
                    result.set_exception(exc)
            if future.cancelled():  # given up by aclose()
                return None
            return future.result()
        finally:
            self._in_callback = False
            self._callback = None

    async def call_blocking(self, call: Callable[[Any, float], T]) -> T:
        """``call(handle, timeout)`` on this consumer's librdkafka handle, off the event
        loop (the offsets commands' reads), with the transport's connect timeout."""
        kafka, timeout = self._kafka, self._transport.connect_timeout
        return await self._blocking(lambda: call(kafka, timeout))

    async def _blocking(self, call: Callable[[], T]) -> T:
        # A blocking librdkafka call, off the event loop: in the consume thread while a
        # rebalance callback waits there, else in the loop's executor.
        if self._in_callback:
            result: concurrent.futures.Future[T] = concurrent.futures.Future()
            self._calls.put((call, result))
            return await asyncio.wrap_future(result)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    # -- fetching -----------------------------------------------------------------------

    def _consume(self, kafka: Any, timeout: float, max_records: int) -> _Batch:
        # In the consume thread. consume(n, t) waits for all n records or t seconds, so
        # wait for the first record only and take what else is queued without waiting.
        starts: dict[TopicPartition, int] = {}
        held = self._held
        with self._wanted_lock:
            wanted, self._wanted = self._wanted, None
        if wanted is not None:
            fresh = [tp for tp, p in wanted.items() if p is None]
            starts = self._starts(kafka, fresh, committed=False)
            offsets = {**{tp: p for tp, p in wanted.items() if p is not None}, **starts}
            if held is not None:  # read again from the kept positions
                held.drop(list(held.runs))
            kafka.assign(
                [ck.TopicPartition(tp.topic, tp.partition, o) for tp, o in offsets.items()]
            )
        waiting = held.count if held is not None else 0
        # Records held back for a budget are handed over at once: no wait for more, and
        # nothing more taken while as many as one getmany returns are held.
        records = kafka.consume(max_records - waiting, 0) if waiting < max_records else []
        end = time.monotonic() + timeout
        while not records and not waiting and not self._closed and self._wanted is None:
            left = end - time.monotonic()
            if left <= 0:
                break
            records = kafka.consume(1, min(left, _SLICE))
            if records and max_records > 1:
                records.extend(kafka.consume(max_records - 1, 0))
        if self._meta_stale and self._group_id is not None:
            # Here, outside the rebalance callbacks: asked from the event loop's thread
            # while this thread waits in a callback for the loop, it never returned.
            self._meta_stale = False
            self._group_meta = kafka.consumer_group_metadata()
        batches = batches_of(records) if held is None else held.take(runs_of(records))
        return starts, batches, self._highwaters(kafka), self._read_past(kafka)

    def _read_past(self, kafka: Any) -> dict[TopicPartition, int]:
        # librdkafka's position moves past the records consume never returns: transaction
        # markers, and aborted records under read_committed. Without it, a partition that
        # ends in a marker (every changelog written by exactly-once) is never read to its
        # high watermark. Not of a partition with records held back: they come first.
        held = self._held
        ktps = [self._ktp(tp) for tp in self._owned if held is None or tp not in held.runs]
        if not ktps:
            return {}
        return {
            TopicPartition(k.topic, k.partition): int(k.offset)
            for k in kafka.position(ktps)
            if k.offset >= 0
        }

    def _highwaters(self, kafka: Any) -> dict[TopicPartition, int]:
        highs = {}
        for tp in self._owned:
            high = kafka.get_watermark_offsets(self._ktp(tp), cached=True)[1]
            if high >= 0:
                highs[tp] = int(high)
        return highs

    async def getmany(
        self, timeout: float, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Message]]:
        """Up to ``max_records`` records; rebalance callbacks due run first."""
        kafka = self._kafka
        if kafka is None:
            await self.start()
            kafka = self._kafka
        if self._closed:
            return {}
        future = self._inflight
        if future is None:
            loop = asyncio.get_running_loop()
            future = self._inflight = asyncio.wrap_future(
                self._thread.submit(self._consume, kafka, timeout, max_records), loop=loop
            )
        try:
            # A cancelled getmany leaves the batch to the next call: nothing is dropped.
            starts, records, highs, read_past = await asyncio.shield(future)
        except RDKAFKA_ERRORS as exc:
            raise translate(exc) from exc
        finally:
            if future.done():
                self._inflight = None
        if self._fatal is not None:
            raise self._fatal
        if starts:
            self._positions.update({tp: o for tp, o in starts.items() if tp in self._owned})
        self._highs = highs
        out = {} if self._closed or not records else self._owned_only(records)
        positions = self._positions
        for tp, offset in read_past.items():  # after the records, which set positions too
            if offset > positions.get(tp, offset):
                positions[tp] = offset
        return out

    def _owned_only(
        self, batches: dict[TopicPartition, RawMessages]
    ) -> Mapping[TopicPartition, Sequence[Message]]:
        # On the loop: records of partitions this consumer no longer (or not yet) holds are
        # dropped; the others move the positions.
        positions = self._positions
        out: dict[TopicPartition, Sequence[Message]] = {}
        for tp, messages in batches.items():
            if tp in positions:
                positions[tp] = messages.raw[-1].offset() + 1
                out[tp] = messages
        return out

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``getmany`` returns for ``tp``.

        Unknown (``TransportError``) between an assignment and the ``getmany`` that
        resolves where the partition starts.
        """
        try:
            return self._positions[tp]
        except KeyError:
            why = "is not known yet" if tp in self._owned else "is not assigned to this consumer"
            raise TransportError(f"the position of {tp.topic}[{tp.partition}] {why}") from None

    def highwater(self, tp: TopicPartition) -> int | None:
        """The log end offset of ``tp`` from the last fetch response, or None."""
        return self._highs.get(tp) if tp in self._positions else None

    # -- offsets ------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit, for each partition, the offset of the next record to read."""
        if self._group_id is None or self._closed:
            why = "is closed" if self._closed else "has no group_id"
            raise CommitFailed(f"cannot commit: this consumer {why}")
        if self._kafka is None:
            await self.start()
        if not offsets:
            return
        kafka = self._kafka
        wanted = [ck.TopicPartition(tp[0], tp[1], off) for tp, off in offsets.items()]
        with map_rdkafka_errors(commit=True):
            call = functools.partial(kafka.commit, offsets=wanted, asynchronous=False)
            done = await (self._blocking(call) if self._in_callback else self._commit_aside(call))
        failed = [k for k in done or () if k.error is not None]
        if failed:
            raise translate(ck.KafkaException(failed[0].error), commit=True)

    async def _commit_aside(self, call: Callable[[], T]) -> T:
        # A commit from the loop's executor, given up if a rebalance callback begins
        # meanwhile: librdkafka holds such a commit until the callback returns, and the
        # callback waits for the event loop, where the revocation's own checkpoint waits
        # for this one's (a deadlock, seen stopping two workers of one group).
        pending = asyncio.get_running_loop().run_in_executor(None, call)
        while True:
            done, _ = await asyncio.wait([pending], timeout=_SLICE)
            if done:
                return pending.result()
            if self._in_callback:
                pending.add_done_callback(_retrieved)  # its outcome is moot now
                raise CommitFailed("commit given up: the group is rebalancing")

    def group_metadata(self) -> Any:
        """The consumer's group metadata (group, generation, member), which a
        transactional producer sends with its offsets (KIP-447)."""
        if self._kafka is None or self._group_id is None:
            raise TransportError("no group metadata: this consumer is not in a group")
        if self._group_meta is None:
            raise TransportError("no group metadata yet: the consumer has not fetched")
        # Read by the consume thread after the last rebalance: librdkafka's call waits for
        # its main thread, which waits for a rebalance callback, which may be waiting for
        # the event loop (the caller): asked from here, it deadlocked the worker.
        return self._group_meta

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for ``tp``, or None.

        Not in the ``Consumer`` protocol (the runtime never asks): tests use it.
        """
        if self._group_id is None:
            raise ConfigurationError("committed() needs a consumer with a group_id")
        if self._kafka is None:
            await self.start()
        kafka, timeout = self._kafka, self._transport.connect_timeout
        with map_rdkafka_errors():
            (got,) = await self._blocking(
                lambda: kafka.committed([ck.TopicPartition(tp[0], tp[1])], timeout=timeout)
            )
        return None if got.offset < 0 else int(got.offset)


# Answers of a partition whose leader is not known yet (a topic just created, a leader
# moving): asked again until the timeout, not raised out of a rebalance callback.
_TRANSIENT = frozenset(
    {
        ck.KafkaError.NOT_LEADER_FOR_PARTITION,
        ck.KafkaError.LEADER_NOT_AVAILABLE,
        ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
        ck.KafkaError._UNKNOWN_PARTITION,
        ck.KafkaError._UNKNOWN_TOPIC,
        ck.KafkaError._TRANSPORT,
        ck.KafkaError._TIMED_OUT,
    }
)


def _watermarks(kafka: Any, ktp: Any, timeout: float) -> tuple[int, int]:
    """The low and high watermarks of ``ktp``, asking again while its leader is not
    known (librdkafka raises NOT_LEADER_FOR_PARTITION for a topic created a moment ago)."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    tries = 0
    while True:
        tries += 1
        try:
            low, high = kafka.get_watermark_offsets(ktp, timeout=timeout, cached=False)
            return int(low), int(high)
        except Exception as exc:  # KafkaException, or what librdkafka raises of its own
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, ck.KafkaError) else None
            # Asked twice at least: a process paused (SIGSTOP, a frozen VM) during the
            # first request comes back to it timed out, and past the deadline.
            if code not in _TRANSIENT or (tries > 1 and time.monotonic() + delay > deadline):
                raise
        time.sleep(delay)  # in the consume thread
        delay = min(delay * 2, 1.0)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # read, so that asyncio does not log it as never retrieved
