"""The fetch loop: batches from the consumer to the agent instances that own them.

One loop per worker reads a batch per partition (``getmany``), registers it with the
``OffsetTracker`` (its offsets are now pending), and queues it, undecoded, on the
``StreamSource`` of every agent instance that reads the topic; the stream decodes each
record as its agent reaches it. A full source queue makes ``put`` wait: backpressure on
the fetch. Partials of windowed tables owned here are applied inline. The fetcher also
answers the questions asked of the consumer's progress: lag, caught-up partitions, and
the watchdog's "is anything moving?".
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...checkpoint import OffsetTracker, PendingBatch
from ...clock import Clock
from ...errors import TransportError, WorkerStalled
from ...metrics import Metrics
from ...records import Message, TopicPartition
from ...streams import Batch
from ...transports import Consumer
from ..output.latency import LatencyProbe, LatencyProbes, LatencyTracker
from ..tables.keeper import StateKeeper

if TYPE_CHECKING:
    from .routes import Route

__all__ = ["Fetcher"]


class Fetcher:
    """Reads batches from one consumer and hands them to the agents' sources."""

    def __init__(
        self,
        consumer: Consumer,
        *,
        routes: dict[str, Route],
        tracker: OffsetTracker,
        state: StateKeeper,
        metrics: Metrics,
        latency: LatencyTracker | None = None,
        probes: LatencyProbes | None = None,
        gate: asyncio.Lock | None = None,
    ) -> None:
        self.consumer = consumer
        # Exactly-once: held while a fetch is dispatched, so a checkpoint that holds it
        # sees no partials applied and no batch half-queued.
        self.gate = gate
        self.latency = latency
        self.probes = probes
        self.routes = routes
        self.tracker = tracker
        self.state = state
        self.metrics = metrics
        self.records_in = 0
        self.dispatching = False
        self._records_in_by_topic: dict[str, Any] = {}
        # agent -> (batch_seconds child, latency probe), resolved once
        self._per_agent: dict[str, tuple[Any, LatencyProbe | None]] = {}
        # The timestamp of the newest record fetched per partition: lag in seconds.
        self.newest_ts: dict[TopicPartition, int] = {}
        self._unsent: set[TopicPartition] = set()

    async def run(self, stop: asyncio.Event, timeout: float, max_records: int) -> None:
        """Fetch and dispatch until ``stop`` is set."""
        consumer = self.consumer
        state = self.state
        gate = self.gate
        while not stop.is_set():
            wait = timeout
            if state.windowed:
                if state.holding():
                    await state.relieve()  # a checkpoint first writes what owners hold
                if state.shipping():
                    wait = 0.0  # the next chunk of a closing window goes out at once
            batches = await consumer.getmany(wait, max_records)
            if gate is not None:
                await gate.acquire()
            try:
                if state.windowed and state.has_outbox():
                    # A closing window's next chunk waits while the fetches come full:
                    # the partials of the chunks before it are still to take.
                    ship = not _full(batches, max_records)
                    if ship or not state.shipping():
                        await state.flush_outbox(ship=ship)
                if not batches:
                    continue
                self.dispatching = True
                # Fetched and not handed over yet (a full queue makes a put wait): a join
                # waiting for one of these partitions must not give up on it (``behind``).
                self._unsent = {tp for tp, messages in batches.items() if messages}
                try:
                    for tp, messages in batches.items():
                        if messages:
                            await self._dispatch(tp, messages)
                        self._unsent.discard(tp)
                finally:
                    self.dispatching = False
                    self._unsent = set()
            finally:
                if gate is not None:
                    gate.release()

    async def _dispatch(self, tp: TopicPartition, messages: Sequence[Message]) -> None:
        self.records_in += len(messages)
        counter = self._records_in_by_topic.get(tp.topic)
        if counter is None:  # resolved once per topic: labels() takes a lock and a lookup
            counter = self._records_in_by_topic[tp.topic] = self.metrics.records_in.labels(tp.topic)
        counter.inc(len(messages))
        first, end = messages[0], messages[-1].offset + 1
        self.newest_ts[tp] = messages[-1].timestamp
        if self.latency is not None:
            self.latency.fetched(tp, end, first.timestamp)
        route = self.routes.get(tp.topic)
        if route is None:  # partials for a windowed table owned here: apply them inline
            entry = self.tracker.add(tp, end, 1, first.offset, first.timestamp)
            await self.state.receive_partials(tp, messages)
            entry.release()
            return
        readers = route.readers
        entry = self.tracker.add(tp, end, len(readers), first.offset, first.timestamp)
        fetched = time.monotonic()
        for agent, sources in readers:
            source = sources[tp.partition % len(sources)]
            histogram, probe = self._agent_metrics(agent.name)
            done = functools.partial(self._done, entry, fetched, histogram, probe, first.timestamp)
            batch = Batch(route.topic, tp, messages, done)
            if len(readers) == 1:
                entry.progress = functools.partial(source.progress_of, batch)
            await source.put(batch)

    def _agent_metrics(self, agent: str) -> tuple[Any, LatencyProbe | None]:
        resolved = self._per_agent.get(agent)
        if resolved is None:
            probe = None if self.probes is None else self.probes.of(agent)
            resolved = self._per_agent[agent] = (self.metrics.batch_seconds.labels(agent), probe)
        return resolved

    @staticmethod
    def _done(
        entry: PendingBatch,
        fetched: float,
        histogram: Any,
        probe: LatencyProbe | None,
        oldest_ms: int,
    ) -> None:
        histogram.observe(time.monotonic() - fetched)
        entry.release()
        if probe is not None and not probe.busy:  # its outputs are published by now
            probe.done(oldest_ms)

    # -- progress -------------------------------------------------------------------------

    def lagging(self) -> list[str]:
        """Assigned partitions whose position is behind the high watermark."""
        consumer = self.consumer
        out = []
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            try:
                if high is not None and consumer.position(tp) < high:
                    out.append(f"{tp.topic}/{tp.partition}")
            except TransportError:
                continue
        return sorted(out)

    def behind(self, tp: TopicPartition) -> bool:
        """True when ``tp`` has records not fetched yet (as far as the last fetch knows),
        or fetched and not yet queued for its agents."""
        if tp in self._unsent:
            return True
        consumer = self.consumer
        try:
            high = consumer.highwater(tp)
            return high is not None and consumer.position(tp) < high
        except TransportError:  # not assigned (any more), or no position yet
            return False

    def caught_up(self) -> set[int]:
        """Partition numbers whose every assigned source partition is read to its end."""
        consumer = self.consumer
        behind: set[int] = set()
        numbers: set[int] = set()
        for tp in consumer.assignment():
            if tp.topic not in self.routes:
                continue
            numbers.add(tp.partition)
            high = consumer.highwater(tp)
            if high is None or consumer.position(tp) < high:
                behind.add(tp.partition)
        return numbers - behind

    def read_everything(self, sent_end: dict[tuple[str, int], int]) -> bool:
        """True when every assigned partition is read to its high watermark and past what
        this worker itself wrote to it."""
        consumer = self.consumer
        try:
            for tp in consumer.assignment():
                high = consumer.highwater(tp)
                if high is None:
                    return False
                if consumer.position(tp) < max(high, sent_end.get(tp, 0)):
                    return False
        except TransportError:  # a position not known yet, just after an assignment
            return False
        return True

    async def watch(self, clock: Clock, stall_timeout: float, rebalancing: Any) -> None:
        """Raise ``WorkerStalled``, rather than hang as a zombie, when partitions have lag
        and no record moves for ``stall_timeout`` seconds (``rebalancing()`` pauses it)."""
        last_records, last_progress = -1, clock.monotonic()
        while True:
            await clock.sleep(stall_timeout / 4)
            now = clock.monotonic()
            if self.records_in != last_records or not self.lagging() or rebalancing():
                last_records, last_progress = self.records_in, now
                continue
            if now - last_progress >= stall_timeout:
                raise WorkerStalled(
                    f"no record processed for {now - last_progress:.0f} s while partitions "
                    f"have lag ({', '.join(self.lagging())}); exiting so a supervisor "
                    "restarts the worker"
                )

    async def tick_windows(self, clock: Clock, interval: float) -> None:
        """Let quiet, caught-up partitions move their windowed tables' watermarks."""
        while True:
            await clock.sleep(interval)
            self.state.tick(self.caught_up())


def _full(batches: Mapping[TopicPartition, Sequence[Message]], max_records: int) -> bool:
    return sum(len(messages) for messages in batches.values()) >= max_records
