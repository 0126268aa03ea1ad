"""The worker: runs an App's graph over a transport.

Lifecycle (the only one in flowkit): ``async with Worker(app) as worker`` starts it and
stops it gracefully; ``await worker.run()`` runs until ``stop()``. Inside, one fetch loop
reads batches per partition, decodes each batch once per topic, and hands it to the agent
instances that own the partition; a commit loop commits what is done every
``commit_interval`` seconds; timers and tasks run beside them.

Order of a checkpoint (at-least-once): take the committable offsets, wait until every send
issued so far is acknowledged, then commit those offsets.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..agents import Agent, Timer
from ..app import App
from ..checkpoint import OffsetTracker
from ..clock import Clock, SystemClock
from ..deadletter import dead_letter_topic
from ..errors import (
    CommitFailed,
    FlowkitError,
    GraphError,
    TransportError,
    WorkerStalled,
)
from ..metrics import Metrics
from ..records import Headers, Message, TopicPartition
from ..streams import Batch, StreamSource
from ..transports import Ack, Consumer, Producer, TopicSpec, Transport, transport_from_url
from .dispatch import Dispatcher, Route
from .state import StateKeeper
from .web import WebServer

__all__ = ["Worker", "required_topics"]

log = structlog.get_logger(__name__)

MAX_IN_FLIGHT = 10_000  # unacknowledged sends before an agent waits (bounded memory)


class Worker:
    """Runs one App against one broker.

    >>> import asyncio, flowkit
    >>> app = flowkit.App("demo")
    >>> async def main():
    ...     async with flowkit.Worker(app) as worker:   # memory:// by default
    ...         pass
    ...     return worker.records_in
    >>> asyncio.run(main())
    0
    """

    def __init__(
        self,
        app: App,
        *,
        broker: str | None = None,
        transport: Transport | None = None,
        clock: Clock | None = None,
        group_id: str | None = None,
        commit_interval: float | None = None,
        max_fetch_records: int = 10_000,
        fetch_timeout: float = 0.2,
        queue_batches: int = 4,
        shutdown_timeout: float = 30.0,
        metrics: Metrics | None = None,
        fail_fast: bool = False,
        client_settings: dict[str, Any] | None = None,
        stall_timeout: float | None = 300.0,
        web_port: int | None = None,
        web_host: str = "127.0.0.1",
    ) -> None:
        self.app = app
        self._own_transport = transport is None
        self.transport = transport or transport_from_url(
            broker or app.broker, **(client_settings or {})
        )
        self.clock = clock or SystemClock()
        self.group_id = group_id or app.name
        self.commit_interval = commit_interval or app.commit_interval
        self.max_fetch_records = max_fetch_records
        self.fetch_timeout = fetch_timeout
        self.queue_batches = queue_batches
        self.shutdown_timeout = shutdown_timeout
        self.metrics = metrics or Metrics()
        self.fail_fast = fail_fast
        self.stall_timeout = stall_timeout
        self.web = WebServer(self, web_host, web_port) if web_port is not None else None
        self.tracker = OffsetTracker()
        self.records_in = 0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.dlq_name = dead_letter_topic(app.name)
        self.state = StateKeeper(app, self.transport, self.clock, self.send_bytes)
        self.dispatcher: Dispatcher | None = None
        self.tick_interval = 1.0
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._routes: dict[str, Route] = {}
        self._sources: list[tuple[Agent[Any], StreamSource]] = []
        self._in_flight: list[Awaitable[Any]] = []
        self._fetch_task: asyncio.Task[None] | None = None
        self._agent_tasks: list[asyncio.Task[None]] = []
        self._side_tasks: list[asyncio.Task[None]] = []
        self._outbox_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()
        self._error: BaseException | None = None
        self._dispatching = False
        self._commit_lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._force = False
        self._assigned: set[TopicPartition] = set()
        self._rebalancing = 0
        self._joined = False
        self._running = False  # start() finished: connected, subscribed, loops started
        self._sent_end: dict[TopicPartition, int] = {}
        self._reported: dict[str, int] = {}
        self._records_in_by_topic: dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(self) -> None:
        """Start, run until ``stop()`` (or a fatal error), then stop gracefully."""
        await self.start()
        try:
            await self._stop.wait()
        finally:
            await self.aclose()
        if self._error is not None:
            raise self._error

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop; ``force`` skips waiting for queued batches, even when a
        graceful stop is already waiting for them."""
        if force:
            self._force = True
            self._forced.set()
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._stop.is_set()

    @property
    def error(self) -> BaseException | None:
        """The fatal error that stopped the worker, if any."""
        return self._error

    async def start(self) -> None:
        """Validate the app, create topics, connect, and start the loops."""
        if self._started:
            return
        problems = self.app.graph().check()
        if problems:
            raise GraphError(problems)
        self.app._freeze(self)
        self._started = True
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise

    async def _start(self) -> None:
        app = self.app
        self.started_at = self.clock.monotonic()
        if self.web is not None:
            await self.web.start()  # first, so /ready answers 503 while recovering
            log.info(
                "serving /metrics, /ready and /graph", url=f"http://{self.web.host}:{self.web.port}"
            )
        await self.transport.create_topics(required_topics(app))
        self._producer = self.transport.producer(client_id=f"{app.name}-producer")
        await self._producer.start()
        for topic in app.topics.values():
            topic._sender = self
        dispatcher = self.dispatcher = Dispatcher(
            app,
            send=self.send_bytes,
            clock=self.clock,
            metrics=self.metrics,
            fail_fast=self.fail_fast,
            queue_batches=self.queue_batches,
        )
        self._routes, self._sources = dispatcher.routes, dispatcher.sources
        dispatcher.start_sinks(self._spawn)
        await self.state.start_globals()
        for agent, source in self._sources:
            if self.state.windowed:
                source.on_drained = self._flush_outbox_soon
            self._agent_tasks.append(
                self._spawn(dispatcher.drive(agent, source), f"agent:{source.name}")
            )
        subscribed = sorted({*self._routes, *self.state.repartition})
        if subscribed:
            self._consumer = self.transport.consumer(
                group_id=self.group_id, client_id=f"{app.name}-consumer"
            )
            await self._consumer.start()
            self._consumer.subscribe(subscribed, self)
            self._fetch_task = self._spawn(self._fetch_loop(), "fetch")
        self._side_tasks.append(self._spawn(self._commit_loop(), "commit"))
        if self.state.windowed:
            self._side_tasks.append(self._spawn(self._tick_loop(), "window-ticks"))
        if self.stall_timeout and self._consumer is not None:
            self._side_tasks.append(self._spawn(self._watchdog(), "watchdog"))
        for timer in app.timers:
            self._side_tasks.append(self._spawn(self._run_timer(timer), f"timer:{timer.name}"))
        self._running = True
        log.info(
            "worker started",
            app=app.name,
            broker=self.transport.url,
            agents=[a.name for a in app.agents],
            topics=sorted(self._routes),
        )

    def _flush_outbox_soon(self) -> None:
        """An agent caught up: send the windowed tables' partials and markers now, not
        after the next fetch returns (up to ``fetch_timeout`` later when no data comes)."""
        task = self._outbox_task
        if (task is None or task.done()) and not self._closed and self.state.has_outbox():
            self._outbox_task = self._spawn(self.state.flush_outbox(), "outbox")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._error is None:
            self._error = exc
            log.error("worker stopping on a fatal error", task=task.get_name(), error=repr(exc))
            self.stop(force=True)

    async def aclose(self) -> None:
        """Stop gracefully: finish queued batches, commit, disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for task in self._side_tasks:
            task.cancel()
        if self._fetch_task is not None:
            self._fetch_task.cancel()
            await asyncio.gather(self._fetch_task, return_exceptions=True)
        for _, source in self._sources:
            source.close()
        if self._agent_tasks:
            if not self._force:
                # Wait for the queued batches, unless a forced stop comes first.
                agents: asyncio.Future[Any] = asyncio.gather(
                    *self._agent_tasks, return_exceptions=True
                )
                forced: asyncio.Future[Any] = asyncio.ensure_future(self._forced.wait())
                await asyncio.wait(
                    {agents, forced},
                    timeout=self.shutdown_timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                forced.cancel()
            for task in self._agent_tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*self._agent_tasks, return_exceptions=True)
        await asyncio.gather(*self._side_tasks, return_exceptions=True)
        if self._outbox_task is not None:  # never cancelled: it sends what it drained
            await asyncio.gather(self._outbox_task, return_exceptions=True)
        try:
            if self._error is None and self._consumer is not None:
                await self.checkpoint()
        except FlowkitError as exc:
            self._error = self._error or exc
        finally:
            if self.dispatcher is not None:
                await self.dispatcher.aclose_sinks()
            for topic in self.app.topics.values():
                if topic._sender is self:
                    topic._sender = None
            # A lost broker can make closing fail too: report it, don't mask the cause.
            for client in (self._consumer, self._producer):
                if client is not None:
                    try:
                        await client.aclose()
                    except (Exception, asyncio.CancelledError) as exc:
                        log.warning("closing a broker client failed", error=repr(exc))
            await self.state.aclose()
            if self.web is not None:
                await self.web.aclose()
            if self._own_transport:
                await self.transport.aclose()
            self.app._unfreeze(self)
            self.stopped_at = self.clock.monotonic()
            log.info("worker stopped", app=self.app.name, records=self.records_in)

    # -- rebalancing (called by the consumer inside getmany) ------------------------------

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._assigned |= assigned
        self._joined = True
        self.metrics.assigned_partitions.set(len(self._assigned))
        log.info("partitions assigned", partitions=_show(assigned))
        # Tables first: no record of a partition is processed before its state is back.
        self._rebalancing += 1
        try:
            await self.state.recover({tp.partition for tp in assigned})
        finally:
            self._rebalancing -= 1

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._rebalancing += 1
        try:
            await self._revoke(revoked)
        finally:
            self._rebalancing -= 1

    async def _revoke(self, revoked: set[TopicPartition]) -> None:
        log.info("partitions revoked", partitions=_show(revoked))
        # Finish what was dispatched for these partitions, then commit it, while we still
        # own them: the next owner starts exactly where we stopped.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while self.tracker.in_flight(revoked) and loop.time() < deadline:
            if self._error is not None:
                break
            await asyncio.sleep(0.005)
        if self._error is None:
            await self.checkpoint(revoked)
        self.tracker.forget(revoked)
        self._assigned -= revoked
        kept = {tp.partition for tp in self._assigned}
        self.state.revoke({tp.partition for tp in revoked} - kept)
        self.metrics.assigned_partitions.set(len(self._assigned))

    # -- the fetch loop -------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        state = self.state
        while not self._stop.is_set():
            batches = await consumer.getmany(self.fetch_timeout, self.max_fetch_records)
            if state.windowed and state.has_outbox():
                await state.flush_outbox()
            if not batches:
                continue
            self._dispatching = True
            try:
                for tp, messages in batches.items():
                    if messages:
                        await self._dispatch(tp, messages)
            finally:
                self._dispatching = False

    async def _dispatch(self, tp: TopicPartition, messages: list[Message]) -> None:
        self.records_in += len(messages)
        counter = self._records_in_by_topic.get(tp.topic)
        if counter is None:  # resolved once per topic: labels() takes a lock and a lookup
            counter = self._records_in_by_topic[tp.topic] = self.metrics.records_in.labels(tp.topic)
        counter.inc(len(messages))
        route = self._routes.get(tp.topic)
        if route is None:  # partials for a windowed table owned here: apply them inline
            entry = self.tracker.add(tp, messages[-1].offset + 1, 1)
            await self.state.receive_partials(tp, messages)
            entry.release()
            return
        # Records are decoded by the stream, one at a time, as the agent reads them.
        readers = route.readers
        entry = self.tracker.add(tp, messages[-1].offset + 1, len(readers))
        for _agent, sources in readers:
            source = sources[tp.partition % len(sources)]
            batch = Batch(route.topic, tp, messages, entry.release)
            if len(readers) == 1:
                entry.progress = functools.partial(source.progress_of, batch)
            await source.put(batch)

    # -- sends ----------------------------------------------------------------------------

    async def send_bytes(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Any]:
        """Send encoded bytes; the ack is awaited before the next commit."""
        producer = self._producer
        if producer is None:
            raise TransportError("the worker's producer is not running")
        ack = await producer.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if isinstance(ack, Ack):  # already stored (the memory broker): nothing to await
            tp = (ack.topic, ack.partition)
            sent: dict[Any, int] = self._sent_end
            if ack.offset >= sent.get(tp, 0):
                sent[tp] = ack.offset + 1
            return ack
        in_flight = self._in_flight
        in_flight.append(ack)
        if len(in_flight) >= MAX_IN_FLIGHT:
            await self._await_in_flight()
        return ack

    async def _await_in_flight(self) -> None:
        pending, self._in_flight = self._in_flight, []
        sent: dict[Any, int] = self._sent_end
        for ack in pending:
            if not isinstance(ack, Ack):  # an Ack is already stored; others are futures
                try:
                    ack = await ack
                except Exception as exc:
                    raise TransportError(f"a send was not acknowledged: {exc!r}") from exc
            # A plain tuple hashes and compares like the TopicPartition namedtuple.
            tp = (ack.topic, ack.partition)
            if ack.offset >= sent.get(tp, 0):
                sent[tp] = ack.offset + 1

    # -- commits --------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await self.clock.sleep(self.commit_interval)
            try:
                await self.checkpoint()
            except CommitFailed as exc:
                # The group is rebalancing: the revocation that follows commits what is
                # done while we still own it; until then the records stay uncommitted.
                log.warning("commit refused during a rebalance; retrying later", error=str(exc))

    async def checkpoint(self, tps: set[TopicPartition] | None = None) -> None:
        """Commit what is done: sends acknowledged first, then offsets."""
        consumer = self._consumer
        if consumer is None:
            await self._await_in_flight()
            return
        async with self._commit_lock:
            offsets = self.tracker.committable(tps)
            # Every send caused by a done record was issued before the record became done,
            # so it is in the in-flight list now, and every table change it made is in the
            # tables' buffers: send those, acknowledge everything, then commit.
            if self.dispatcher is not None:
                await self.dispatcher.flush_sinks()  # may dead-letter: before the acks
            await self.state.flush_outbox()
            await self.state.flush_changelogs()
            await self._await_in_flight()
            if not offsets:
                return
            self._update_metrics()
            started = self.clock.monotonic()
            await consumer.commit(offsets)
            self.tracker.committed(offsets)
            self.metrics.commits.inc()
            self.metrics.commit_seconds.observe(self.clock.monotonic() - started)

    async def _watchdog(self) -> None:
        """Exit, rather than hang as a zombie, when lag does not move for stall_timeout."""
        assert self.stall_timeout is not None
        last_records, last_progress = -1, self.clock.monotonic()
        while True:
            await self.clock.sleep(self.stall_timeout / 4)
            now = self.clock.monotonic()
            if self.records_in != last_records or not self._lagging() or self._rebalancing:
                last_records, last_progress = self.records_in, now
                continue
            if now - last_progress >= self.stall_timeout:
                raise WorkerStalled(
                    f"no record processed for {now - last_progress:.0f} s while partitions "
                    f"have lag ({', '.join(self._lagging())}); exiting so a supervisor "
                    "restarts the worker"
                )

    def _lagging(self) -> list[str]:
        consumer = self._consumer
        if consumer is None:
            return []
        out = []
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            try:
                if high is not None and consumer.position(tp) < high:
                    out.append(f"{tp.topic}/{tp.partition}")
            except TransportError:
                continue
        return sorted(out)

    @property
    def ready(self) -> bool:
        """True once the worker joined its group and holds its tables' state."""
        return (
            self._running
            and not self._closed
            and (self._consumer is None or self._joined)
            and not self._rebalancing
        )

    def _update_metrics(self) -> None:
        """Move per-agent counts into Prometheus once per checkpoint, not per record."""
        reported = self._reported
        for agent, source in self._sources:
            done = source.records - reported.get(source.name, 0)
            if done:
                self.metrics.records_processed.labels(agent.name).inc(done)
                reported[source.name] = source.records
            self.metrics.queue_depth.labels(source.name).set(source.pending())
        if self.dispatcher is not None:
            for name, count in self.dispatcher.outputs.items():
                sent = count - reported.get(f"out:{name}", 0)
                if sent:
                    self.metrics.outputs.labels(name).inc(sent)
                    reported[f"out:{name}"] = count

    async def _tick_loop(self) -> None:
        while True:
            await self.clock.sleep(self.tick_interval)
            self.state.tick(self._caught_up())

    def _caught_up(self) -> set[int]:
        """Partition numbers whose every assigned source partition is read to its end."""
        consumer = self._consumer
        if consumer is None:
            return set()
        behind: set[int] = set()
        numbers: set[int] = set()
        for tp in consumer.assignment():
            if tp.topic not in self._routes:
                continue
            numbers.add(tp.partition)
            high = consumer.highwater(tp)
            if high is None or consumer.position(tp) < high:
                behind.add(tp.partition)
        return numbers - behind

    # -- timers and tasks -----------------------------------------------------------------

    async def _run_timer(self, timer: Timer) -> None:
        if timer.interval is None:
            await self._call_guarded(timer)
            return
        while True:
            await self.clock.sleep(timer.interval)
            await self._call_guarded(timer)

    async def _call_guarded(self, timer: Timer) -> None:
        try:
            await timer.fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.fail_fast:
                raise
            log.exception(f"{timer.kind} failed", name=timer.name, error=repr(exc))

    # -- introspection --------------------------------------------------------------------

    def is_idle(self) -> bool:
        """True when nothing is fetched, queued, processing or unacknowledged."""
        if self._dispatching or self._rebalancing or self.state.has_outbox():
            return False
        if self.dispatcher is not None and self.dispatcher.sinks_busy():
            return False
        if any(source.busy() for _, source in self._sources):
            return False
        if self.tracker.in_flight():
            return False
        sent = self._sent_end
        for ack in self._in_flight:
            if not _done(ack):
                return False
            try:
                result = ack if isinstance(ack, Ack) else ack.result()  # type: ignore[attr-defined]
            except Exception:
                return False  # a failed send: the next checkpoint raises it
            tp = TopicPartition(result.topic, result.partition)
            if result.offset >= sent.get(tp, 0):
                sent[tp] = result.offset + 1
        consumer = self._consumer
        if consumer is not None:
            if not self._joined:
                return False  # not part of the group yet: nothing is known
            try:
                for tp in consumer.assignment():
                    high = consumer.highwater(tp)
                    if high is None:
                        return False
                    if consumer.position(tp) < max(high, sent.get(tp, 0)):
                        return False
            except TransportError:  # a position not known yet, just after an assignment
                return False
        return True

    @property
    def elapsed(self) -> float:
        """Seconds the worker has been running (or ran)."""
        if self.started_at is None:
            return 0.0
        end = self.stopped_at if self.stopped_at is not None else self.clock.monotonic()
        return max(end - self.started_at, 0.0)

    def summary(self) -> str:
        """One line: records processed and the rate."""
        seconds = self.elapsed
        rate = self.records_in / seconds if seconds > 0 else 0.0
        return f"processed {self.records_in} records in {seconds:.1f} s ({rate:,.0f} records/s)"


def required_topics(app: App) -> list[TopicSpec]:
    """Every topic a worker of ``app`` needs: declared, dead-letter, changelog and
    repartition topics, with their partition counts."""
    specs = [TopicSpec(t.name, t.partitions, compacted=t.compacted) for t in app.topics.values()]
    dead_letters = {dead_letter_topic(app.name)}
    dead_letters.update(a.dead_letter for a in app.agents if a.dead_letter)
    specs.extend(TopicSpec(name, 1) for name in sorted(dead_letters) if name not in app.topics)
    specs.extend(StateKeeper.specs_for(app))
    return specs


def _done(awaitable: Awaitable[Any]) -> bool:
    if isinstance(awaitable, Ack):
        return True  # an Ack is its own completed result (the memory broker's)
    return bool(awaitable.done())  # type: ignore[attr-defined]


def _show(tps: set[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)


def _callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
