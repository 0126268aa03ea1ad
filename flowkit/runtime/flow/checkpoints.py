"""Checkpoints: commit what is done, only after everything it caused is acknowledged.

Order of a checkpoint (at-least-once): take the committable offsets; flush the sinks
(they may dead-letter); send the windowed tables' partials and markers; take the changed
keys of every table, wait until every send so far is acknowledged, then send those keys
to the changelogs and wait for their acknowledgements; write the tables' local state,
stamped with the changelog offsets it reflects; then commit those offsets. A
record whose effects are not all acknowledged is never committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from ...checkpoint import OffsetTracker
from ...clock import Clock
from ...errors import CommitFailed, TransactionAborted, TransportError
from ...metrics import Metrics
from ...records import TopicPartition
from ...streams import Barrier, StreamSource
from ...transports import Consumer, TransactionalProducer
from ..output.latency import LatencyTracker
from ..output.publisher import Publisher
from ..tables.keeper import StateKeeper

__all__ = ["Checkpointer", "aborted_in"]

log = structlog.get_logger(__name__)


class Checkpointer:
    """Runs the checkpoints of one worker, one at a time."""

    def __init__(
        self,
        *,
        consumer: Consumer | None,
        tracker: OffsetTracker,
        publisher: Publisher,
        state: StateKeeper,
        flush_sinks: Callable[[], Awaitable[None]],
        report: Callable[[], None],
        metrics: Metrics,
        clock: Clock,
        latency: LatencyTracker | None = None,
        transactions: TransactionalProducer | None = None,
        align: Callable[[], tuple[Barrier, list[StreamSource]]] | None = None,
        gate: asyncio.Lock | None = None,
    ) -> None:
        self.latency = latency
        self.transactions = transactions  # exactly-once: the producer of the transactions
        self._align = align  # a barrier for every agent instance, and the instances
        self._gate = gate  # held by the fetcher while it dispatches (and applies partials)
        self.consumer = consumer
        self.tracker = tracker
        self.publisher = publisher
        self.state = state
        self._flush_sinks = flush_sinks
        self._report = report
        self.metrics = metrics
        self.clock = clock
        self._lock = asyncio.Lock()

    async def checkpoint(self, tps: set[TopicPartition] | None = None) -> None:
        """Commit what is done (of ``tps``, or of every partition): sends first."""
        consumer = self.consumer
        if consumer is None:
            await self.publisher.await_acks()
            return
        if self.transactions is not None:
            await self._transaction(consumer, self.transactions)
            return
        async with self._lock:
            offsets = self.tracker.committable(tps)
            # Every send caused by a done record was issued before the record became done,
            # so it is in flight now, and every table change it made is in the stores'
            # buffers: send those, acknowledge everything, then commit.
            await self._flush_sinks()  # may dead-letter: before the acks
            await self.state.flush_outbox()
            # A step of the windows closing in steps: its results are sent now, so the
            # acknowledgements below cover them before its changes go to the changelog.
            await self.state.close_windows()
            # The changelogs say what the records processed so far did; their outputs are
            # stored before the changelogs are sent, so state never runs ahead of output
            # (a join that recovers a record's state does not emit its results again).
            async with self.state.emitting:  # no close whose results are not sent yet
                changes = self.state.drain_changelogs()
            await self.publisher.await_acks()
            await self.state.send_changelogs(changes)
            await self.publisher.await_acks()
            # Local state follows the changelog, never leads it: written once it is there.
            self.state.persist()
            if not offsets:
                return
            self._report()
            started = self.clock.monotonic()
            await consumer.commit(offsets)
            self.tracker.committed(offsets)
            if self.latency is not None:
                self.latency.committed(offsets)
            self.metrics.commits.inc()
            self.metrics.commit_seconds.observe(self.clock.monotonic() - started)

    async def _transaction(self, consumer: Consumer, producer: TransactionalProducer) -> None:
        # One transaction holds every partition's records: a checkpoint of some partitions
        # (a revocation) commits them all.
        assert self._align is not None and self._gate is not None
        async with self._lock, self._gate:
            barrier, sources = self._align()
            try:  # released whatever happens
                cut = _cut(sources)
                for source in sources:
                    source.queue_barrier(barrier, cut)
                log.debug("transaction: barrier queued")
                await barrier.arrived()
                log.debug("transaction: agents aligned")
                offsets = self.tracker.committable()
                await self._flush_sinks()
                await self.state.flush_outbox()
                await self.state.close_windows()  # a step's results and its changes
                await self.state.send_changelogs(self.state.drain_changelogs())
                await self.publisher.await_acks()
                log.debug(
                    "transaction: sends acknowledged",
                    offsets=sorted(f"{t}/{p}:{o}" for (t, p), o in offsets.items()),
                )
                self._report()
                started = self.clock.monotonic()
                # Outputs alone (windows closed by time) carry the last commit's offsets
                # again, so that the broker checks this worker's generation all the same.
                fence = None if offsets else self.tracker.last_committed()
                await producer.commit_transaction(offsets, consumer, fence=fence)
                log.debug("transaction: committed")
                self.state.persist()  # the changelog writes count only now
            except TransportError as exc:
                # A send of the transaction failed: none of it may count.
                aborted = aborted_in(exc)
                if aborted is None:
                    await producer.abort_transaction()
                    aborted = TransactionAborted(f"transaction aborted ({exc})")
                raise aborted from exc
            finally:
                barrier.release()
            if not offsets:
                return
            self.tracker.committed(offsets)
            if self.latency is not None:
                self.latency.committed(offsets)
            self.metrics.commits.inc()
            self.metrics.commit_seconds.observe(self.clock.monotonic() - started)

    async def run(self, interval: float) -> None:
        """Checkpoint every ``interval`` seconds, and at once when a window closing in
        steps has its next step due (``StateKeeper.close_soon``)."""
        while True:
            await self._pause(interval)
            try:
                await self.checkpoint()
            except CommitFailed as exc:
                # The group is rebalancing: the revocation that follows commits what is
                # done while we still own it; until then the records stay uncommitted.
                log.warning("commit refused during a rebalance; retrying later", error=str(exc))

    async def _pause(self, interval: float) -> None:
        soon = self.state.close_soon
        if not self.state.stepwise:
            await self.clock.sleep(interval)
            return
        if not soon.is_set():
            timer = asyncio.ensure_future(self.clock.sleep(interval))
            woken = asyncio.ensure_future(soon.wait())
            try:
                await asyncio.wait((timer, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
                woken.cancel()
        else:
            await asyncio.sleep(0)  # the agents run between two steps
        soon.clear()


def _cut(sources: list[StreamSource]) -> dict[TopicPartition, int]:
    """Per partition, the last record of the newest batch any agent instance has taken:
    every instance reading the partition finishes its batches up to there before the
    commit, and starts none after it.

    The barrier goes ahead of the batches after the cut, so a transaction waits for the
    batch each instance is on, not for every batch queued for it; and where several agents
    read one partition, they all stop after the same record, so the offsets committed are
    those of records whose effects every agent put in the transaction. (The fetcher is
    not dispatching meanwhile: every reader of a fetched batch has it queued.)
    """
    cut: dict[TopicPartition, int] = {}
    for source in sources:
        for tp, last in (source.taken or {}).items():
            if last > cut.get(tp, -1):
                cut[tp] = last
    return cut


def aborted_in(exc: BaseException | None) -> TransactionAborted | None:
    """The ``TransactionAborted`` that ``exc`` is or was caused by, if any.

    >>> aborted_in(TransportError("a send failed")) is None
    True
    >>> try:
    ...     raise TransportError("a send failed") from TransactionAborted("x", fenced=True)
    ... except TransportError as exc:
    ...     aborted_in(exc).fenced
    True
    """
    while exc is not None:
        if isinstance(exc, TransactionAborted):
            return exc
        exc = exc.__cause__
    return None
