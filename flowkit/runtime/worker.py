"""The worker: runs an App's graph over a transport. The only lifecycle in flowkit.

``async with Worker(app) as worker`` starts it and stops it gracefully; ``await
worker.run()`` runs until ``stop()`` or a fatal error. The worker owns the state of its
run (table stores, producer, clock, offsets) and hands it to the code that needs it; the
App stays a declaration, so several workers can run one App at once.

Its parts, each in its own module: ``Fetcher`` (fetch loop, lag), ``Dispatcher`` (the
agents, their outputs and error policies), ``Publisher`` (sends and their acks),
``StateKeeper`` (tables), ``Assignment`` (rebalances), ``Checkpointer`` (commits),
``run_timer`` (timers and tasks), all tasks under one ``Supervisor``.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from .._text import count
from ..app import App, ProcessingGuarantee, check_standby_replicas
from ..checkpoint import OffsetTracker
from ..clock import Clock, SystemClock
from ..deadletter import dead_letter_topic
from ..durations import Seconds
from ..errors import (
    CommitFailed,
    FlowkitError,
    RecordRejected,
    TooManyFailures,
    TransactionAborted,
    TransportError,
)
from ..graph import Graph
from ..metrics import Metrics
from ..records import TopicPartition
from ..scope import TaskScope, enter_scope
from ..state.local import check_data_dir
from ..transports import (
    Consumer,
    OutRecord,
    TransactionalProducer,
    Transport,
    transport_from_url,
)
from .flow.checkpoints import Checkpointer, aborted_in
from .flow.dispatch import Dispatcher
from .flow.fetcher import Fetcher
from .lifecycle import heap
from .lifecycle.assignment import Assignment
from .lifecycle.hooks import run_shutdown_hooks, run_startup_hooks
from .lifecycle.required import checked_graph, required_topics
from .lifecycle.settings import WorkerSettings
from .lifecycle.supervisor import Supervisor
from .lifecycle.timers import leader_of, run_timer
from .observe.collector import WorkerCollector
from .observe.console import Console
from .output.latency import LatencyProbes, LatencyTracker
from .output.publisher import Publisher
from .tables.keeper import DEFAULT_DATA_DIR, StateKeeper
from .tables.standby import OnDisk

if TYPE_CHECKING:
    from .web.access import WebToken
    from .web.limits import WebLimits
    from .web.server import WebServer

__all__ = ["Worker", "WorkerSettings"]

log = structlog.get_logger(__name__)


class Worker:
    """Runs one App against one broker.

    The app's name is its application id: it names the consumer group and every internal
    topic (changelogs, repartition topics, the dead-letter topic). ``max_fetch_records``
    is the most records one fetch returns; ``queue_batches`` how many fetched batches
    wait per agent instance before the fetch waits; ``stall_timeout`` how long partitions
    may have lag with nothing processed before the worker gives up (``WorkerStalled``);
    ``status_interval`` how often a ``status`` line (records/s, lag, partitions) is
    logged, None for never; ``idle_hint``, on the embedded broker, how long without a record
    before the worker says once that only its own process can write there; ``web_port``
    serves the web endpoint (``flowkit.runtime.web.server``)
    on ``web_host``, behind ``web_token`` if given (every route but ``/health`` and
    ``/ready`` then needs ``Authorization: Bearer <token>``), answering to the host names
    of ``web_allowed_hosts`` (with the loopback ones on a loopback address; ``"*"``: any),
    within ``web.limits`` (``flowkit.runtime.web.limits.WebLimits``).
    ``processing_guarantee`` overrides the app's: ``"exactly_once"`` commits each
    checkpoint's outputs, changelog writes, dead letters and offsets in one Kafka
    transaction (``transactional_id`` names its producer; a random one by default).
    ``data_dir`` overrides the app's directory of local table state (``App(data_dir=)``).
    ``standby_replicas`` overrides the app's (``App(standby_replicas=)``).
    ``client_settings`` are Kafka client settings, over the app's and the URL's.

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
        commit_interval: Seconds | None = None,
        max_fetch_records: int = 10_000,
        fetch_timeout: Seconds = 0.2,
        queue_batches: int = 4,
        shutdown_timeout: Seconds = 30.0,
        metrics: Metrics | None = None,
        fail_fast: bool = False,
        client_settings: dict[str, Any] | None = None,
        stall_timeout: Seconds | None = 300.0,
        web_port: int | None = None,
        web_host: str = "127.0.0.1",
        web_token: WebToken | str | None = None,
        web_allowed_hosts: list[str] | None = None,
        web_limits: WebLimits | None = None,
        status_interval: float | None = 30.0,
        idle_hint: float | None = None,
        processing_guarantee: ProcessingGuarantee | None = None,
        transactional_id: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        standby_replicas: int | None = None,
    ) -> None:
        self.app = app
        self.settings = WorkerSettings.of(
            app,
            group_id=group_id,
            commit_interval=commit_interval,
            max_fetch_records=max_fetch_records,
            fetch_timeout=fetch_timeout,
            queue_batches=queue_batches,
            shutdown_timeout=shutdown_timeout,
            stall_timeout=stall_timeout,
            fail_fast=fail_fast,
            processing_guarantee=processing_guarantee,
        )
        self._own_transport = transport is None
        url = broker or app.broker
        settings = {**app.client_settings_for(url), **(client_settings or {})}
        self.transport = transport or transport_from_url(url, **settings)
        # Exactly-once: made here, so a broker without transactions is refused at once.
        self.transactions: TransactionalProducer | None = None
        if self.settings.processing_guarantee == "exactly_once":
            self.transactions = self.transport.transactional_producer(
                transactional_id=transactional_id or f"{app.name}-{uuid.uuid4().hex[:12]}",
                client_id=f"{app.name}-producer",
            )
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.web: WebServer | None = None
        if web_port is not None:
            # The web stack (aiohttp) is imported only by a worker that serves it: a third
            # of a second of every start otherwise.
            from .web.server import WebServer

            self.web = WebServer(
                self,
                web_host,
                web_port,
                token=web_token,
                allowed_hosts=web_allowed_hosts,
                limits=web_limits,
            )
        self.tracker = OffsetTracker()
        self.publisher: Publisher | None = None
        given_dir = data_dir if data_dir is not None else app.data_dir
        self.state = StateKeeper(
            app,
            self.transport,
            self.clock,
            self._send,
            self._send_batch,
            data_dir=None if given_dir is None else Path(given_dir),
            sent_end=lambda: self.publisher.sent_end if self.publisher else {},
            standby_replicas=None
            if standby_replicas is None
            else check_standby_replicas(standby_replicas, "Worker()"),
        )
        if given_dir is not None or any(isinstance(s, OnDisk) for s in self.state.stores.values()):
            check_data_dir(Path(given_dir or DEFAULT_DATA_DIR), "data directory")
        for declared in app.metrics.declared.values():  # the app's own, on this registry
            self.state.stores[declared] = declared.create(self.metrics.registry)
        # What every task of this worker reaches through its context: the tables' stores.
        self.scope = TaskScope(stores=self.state.stores, sender=None, now_ms=self.state.now_ms)
        context = contextvars.copy_context()
        context.run(enter_scope, self.scope)
        self._context = context
        self._hooks_ran = False  # shutdown hooks run only after every startup hook did
        self.supervisor = Supervisor(self._fatal, context)
        self.graph: Graph | None = None  # the app's, built and checked at start
        self.dispatcher: Dispatcher | None = None
        self.fetcher: Fetcher | None = None
        self.checkpointer: Checkpointer | None = None
        self.assignment: Assignment | None = None
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()
        self._error: BaseException | None = None
        self._phase = "new"  # -> starting -> running -> closed
        self._announced = False  # "worker started" was logged
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.metrics.registry.register(WorkerCollector(self))  # read at scrape time
        self.console = Console(self)  # recovery progress on stderr
        self.status_interval = status_interval
        self.idle_hint = idle_hint if self.transport.url.startswith("memory://") else None

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

    def _probes_changed(self) -> None:
        """``/health`` or ``/ready`` may answer otherwise now: the web gate, which answers
        them, hears it at once (not at its next look, which a busy loop delays)."""
        if self.web is not None:
            self.web.probes_changed()

    def _fatal(self, exc: BaseException, task: str) -> None:
        first = self._error is None
        if first:
            if self.transactions is not None:  # a send of the transaction failed, maybe
                exc = aborted_in(exc) or exc
            self._error = exc
        self.stop(force=True)  # before the log line, which a broken stderr could fail
        self._probes_changed()
        if first:
            if isinstance(exc, TransactionAborted) and exc.fenced:
                _log_fenced(task, exc)
            else:
                log.error(
                    "worker stopping on a fatal error", task=task, error=str(exc) or repr(exc)
                )

    async def start(self) -> None:
        """Validate the app, create topics, connect, and start the loops."""
        if self._phase != "new":
            return
        self.graph = await checked_graph(self.app)  # built once: the web's /graph is it
        self.app.freeze()
        self._phase = "starting"
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        self._phase = "running"
        self._probes_changed()
        heap.retain()  # what the worker started with lives as long as it: frozen (heap.py)

    async def _start(self) -> None:
        app, settings, spawn = self.app, self.settings, self.supervisor.spawn
        self.started_at = self.clock.monotonic()
        if self.web is not None:
            await self.web.start()  # first, so /ready answers 503 while recovering
            log.info(
                "serving the page, /metrics, /health, /ready, /graph and /tables", url=self.web.url
            )
        await self.transport.create_topics(required_topics(app))
        spawn(self.transport.watch(), "broker-watch")
        producer = self.transactions or self.transport.producer(client_id=f"{app.name}-producer")
        await producer.start()
        self.publisher = publisher = Publisher(
            producer,
            on_rejected=self._rejected,
            partition_count=self.transport.partition_count,
            before_flush=self._before_flush,  # dead letters are built in batches
            timestamp_bounds=self.transport.timestamp_bounds,
        )
        self.scope.sender = publisher
        dispatcher = self.dispatcher = Dispatcher(
            app,
            scope=self.scope,
            clock=self.clock,
            metrics=self.metrics,
            fail_fast=settings.fail_fast,
            queue_batches=settings.queue_batches,
            spawn=spawn,
            publisher=publisher,
            on_drained=self._flush_outbox_soon if self.state.windowed else None,
            behind=self._behind,  # a join waits for a side that has lag
            exactly_once=self.transactions is not None,  # where each barrier cuts
        )
        await publisher.prepare()  # the partition counts of the topics the agents write
        dispatcher.start_sinks()
        await self.state.start_globals(spawn)
        self.state.start_standbys(spawn)
        await run_startup_hooks(app.startup_hooks, self._context)
        self._hooks_ran = True
        for agent, source in dispatcher.sources:
            spawn(dispatcher.drive(agent, source), f"agent:{source.name}")
        consumer = await self._subscribe(sorted({*dispatcher.routes, *self.state.repartition}))
        gate = asyncio.Lock() if self.transactions is not None else None
        latency = LatencyTracker(
            self.metrics,
            {t: [a.name for a, _ in route.readers] for t, route in dispatcher.routes.items()},
            outputs_at_commit=self.transactions is not None,
        )
        # Exactly-once: outputs are readable from their transaction's commit, which the
        # tracker observes; otherwise from their acknowledgement, which the probes sample.
        probes = LatencyProbes(publisher, self.metrics) if self.transactions is None else None
        self.checkpointer = Checkpointer(
            consumer=consumer,
            tracker=self.tracker,
            publisher=publisher,
            state=self.state,
            flush_sinks=dispatcher.flush_sinks,
            report=dispatcher.report,
            metrics=self.metrics,
            clock=self.clock,
            latency=latency,
            transactions=self.transactions,
            align=dispatcher.barrier,
            gate=gate,
        )
        spawn(self.checkpointer.run(settings.commit_interval), "commit")
        if consumer is not None:
            self.fetcher = fetcher = Fetcher(
                consumer,
                routes=dispatcher.routes,
                tracker=self.tracker,
                state=self.state,
                metrics=self.metrics,
                latency=latency,
                probes=probes,
                gate=gate,
            )
            spawn(
                fetcher.run(self._stop, settings.fetch_timeout, settings.max_fetch_records),
                "fetch",
            )
            if self.state.windowed:
                spawn(fetcher.tick_windows(self.clock, settings.tick_interval), "window-ticks")
            if settings.stall_timeout:
                excused = self._excused
                spawn(fetcher.watch(self.clock, settings.stall_timeout, excused), "watchdog")
        leader = leader_of(list(dispatcher.routes), consumer.assignment if consumer else None)
        if self.status_interval:
            spawn(self.console.run_status(self.status_interval), "status")
        if self.idle_hint:
            spawn(self.console.hint_if_idle(self.idle_hint), "idle-hint")
        for timer in app.timers:
            spawn(
                run_timer(timer, self.clock, fail_fast=settings.fail_fast, leader=leader),
                f"{timer.kind}:{timer.name}",
            )
        log.info(
            "worker started",
            app=app.name,
            broker=self.transport.url,
            agents=[a.name for a in app.agents],
            topics=sorted(dispatcher.routes),
        )
        self._announced = True

    async def _subscribe(self, topics: list[str]) -> Consumer | None:
        if not topics:
            return None
        consumer = self.transport.consumer(
            group_id=self.group_id, client_id=f"{self.app.name}-consumer"
        )
        await consumer.start()
        self.assignment = Assignment(
            state=self.state,
            tracker=self.tracker,
            checkpoint=self.checkpoint,
            failed=lambda: self._error is not None,
            metrics=self.metrics,
            drain_timeout=self.settings.shutdown_timeout,
            forget=self._forget_partitions,
            changed=self._probes_changed,
        )
        consumer.subscribe(topics, self.assignment)
        return consumer

    def _forget_partitions(self, tps: set[TopicPartition]) -> None:
        if self.checkpointer is not None and self.checkpointer.latency is not None:
            self.checkpointer.latency.forget(tps)
        if self.fetcher is not None:
            for tp in tps:
                self.fetcher.newest_ts.pop(tp, None)

    async def _rejected(self, origin: Any, exc: RecordRejected) -> None:
        # The publisher is made before the dispatcher that handles what it refuses.
        assert self.dispatcher is not None
        await self.dispatcher.rejected(origin, exc)

    def _before_flush(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.before_flush()

    def _behind(self, tp: TopicPartition) -> bool:
        return self.fetcher is not None and self.fetcher.behind(tp)

    def _rebalancing(self) -> bool:
        return self.assignment is not None and self.assignment.rebalancing > 0

    def _excused(self) -> bool:
        # No progress is expected while rebalancing, or while an agent pauses on purpose.
        return self._rebalancing() or (self.dispatcher is not None and self.dispatcher.pausing)

    def _flush_outbox_soon(self) -> None:
        """An agent caught up: send the windowed tables' partials and markers now, not
        after the next fetch returns (up to ``fetch_timeout`` later when no data comes)."""
        if self._phase in ("starting", "running") and self.state.has_outbox():
            self.state.flush_outbox_soon(self.supervisor.spawn)

    async def aclose(self) -> None:
        """Stop gracefully: finish queued batches, commit, disconnect. Idempotent."""
        if self._phase == "closed":
            return
        if self._phase == "running":
            heap.release()
        self._phase = "closed"
        self._probes_changed()
        self._stop.set()
        tasks = self.supervisor
        await tasks.cancel(
            tasks.named(
                "fetch", "commit", "window-ticks", "watchdog", "status", "timer:", "broker-watch"
            )
        )
        await tasks.cancel(tasks.named("task:"))
        dispatcher = self.dispatcher
        if dispatcher is not None:
            for _, source in dispatcher.sources:
                source.close()
            agents = tasks.named("agent:")
            if agents and not self._forced.is_set():
                # Wait for the queued batches, unless a forced stop comes first.
                await self._wait_or_forced(agents)
            await tasks.cancel(agents)
        if self._hooks_ran:  # after the agents, before the final commit
            await run_shutdown_hooks(
                self.app.shutdown_hooks, self._context, self.settings.shutdown_timeout
            )
        await self.state.wait_outbox()  # never cancelled: it sends what it drained
        if self.web is not None and self._error is None:
            await self.web.leaving()  # tell the group its tables are no longer here
        # An agent that failed too often stopped a sound worker: what is done (its
        # dead letters too) is committed, up to the record that tripped the guard.
        sound = self._error is None or isinstance(self._error, TooManyFailures)
        try:
            if sound and self.fetcher is not None:
                await self.checkpoint()
        except CommitFailed as exc:
            # The group rebalances as this worker leaves: the revocation commits what it
            # can, and the next owner processes the rest again (at-least-once). Not a
            # failure of this worker.
            log.warning(
                "could not commit at the stop: the group is rebalancing; the newest "
                "records will be processed again by their next owner",
                error=str(exc),
            )
        except FlowkitError as exc:
            self._error = self._error or exc
            self._probes_changed()
        finally:
            try:
                await self._disconnect()
            finally:
                self.state.aclose(clean=self._error is None)

    async def _wait_or_forced(self, tasks: list[asyncio.Task[Any]]) -> None:
        agents: asyncio.Future[Any] = asyncio.gather(*tasks, return_exceptions=True)
        forced: asyncio.Future[Any] = asyncio.ensure_future(self._forced.wait())
        await asyncio.wait(
            {agents, forced},
            timeout=self.settings.shutdown_timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
        forced.cancel()

    async def _disconnect(self) -> None:
        if self.dispatcher is not None:
            await self.dispatcher.aclose_sinks()
        await self.supervisor.aclose()  # whatever is left: global tables, sinks, ...
        # A lost broker can make closing fail too: report it, don't mask the cause.
        if self.transactions is not None and self._error is not None:
            try:  # nothing of a failed worker's open transaction may count, nor wait
                await self.transactions.abort_transaction()
            except (Exception, asyncio.CancelledError) as exc:
                if _fenced(exc) and not _fenced(self._error):
                    # What stopped it (a send timed out while it was paused, say) came
                    # of another worker having taken over: that is the cause, and the
                    # process starts a worker again from the last commit, as when fenced.
                    _log_fenced("abort", exc)
                    self._error = exc
                    self._probes_changed()
                else:
                    log.info("the open transaction could not be aborted", error=repr(exc))
        clients = (
            self.fetcher.consumer if self.fetcher else None,
            self.publisher.producer if self.publisher else None,
        )
        if self.publisher is not None:
            self.publisher.stop_watching()
        for client in clients:
            if client is not None:
                try:
                    await client.aclose()
                except (Exception, asyncio.CancelledError) as exc:
                    if isinstance(self._error, TransportError):  # the broker is gone: expected
                        log.info("a broker client did not close cleanly", error=repr(exc))
                    else:
                        log.warning("closing a broker client failed", error=repr(exc))
        if self.web is not None:
            await self.web.aclose()
        if self._own_transport:
            await self.transport.aclose()
        self.stopped_at = self.clock.monotonic()
        if self._announced:  # a start that failed said neither "worker started" nor this
            log.info("worker stopped", app=self.app.name, records=self.records_in)

    # -- sends and checkpoints ------------------------------------------------------------

    async def _send(self, topic: str, value: bytes | None, **kwargs: Any) -> Any:
        if self.publisher is None:
            raise FlowkitError("the worker's producer is not running")
        return await self.publisher.send_bytes(topic, value, **kwargs)

    async def _send_batch(self, topic: str, partition: int, records: list[OutRecord]) -> None:
        if self.publisher is None:
            raise FlowkitError("the worker's producer is not running")
        await self.publisher.send_batch(topic, partition, records)

    async def checkpoint(self, tps: set[TopicPartition] | None = None) -> None:
        """Commit what is done: sends acknowledged first, then offsets."""
        if self.checkpointer is not None:
            await self.checkpointer.checkpoint(tps)
        elif self.publisher is not None:
            await self.publisher.await_acks()

    # -- introspection --------------------------------------------------------------------

    @property
    def group_id(self) -> str:
        """The consumer group: the app's name."""
        return self.app.name

    @property
    def dlq_name(self) -> str:
        """The app's default dead-letter topic."""
        return dead_letter_topic(self.app.name)

    @property
    def records_in(self) -> int:
        """Records fetched so far."""
        return self.fetcher.records_in if self.fetcher is not None else 0

    @property
    def ready(self) -> bool:
        """True once the worker joined its group and holds its tables' state."""
        assignment = self.assignment
        return self._phase == "running" and (
            assignment is None or (assignment.joined and not assignment.rebalancing)
        )

    def is_idle(self) -> bool:
        """True when nothing is fetched, queued, processing or unacknowledged."""
        if self._rebalancing() or self.state.has_outbox():
            return False
        if self.dispatcher is not None and self.dispatcher.busy():
            return False
        parked = self.dispatcher.parked() if self.dispatcher is not None else 0
        if self.tracker.in_flight() > parked:
            return False  # (records held by a take() list waiting for time or records: idle)
        publisher = self.publisher
        if publisher is not None and not publisher.all_acked():
            return False
        fetcher = self.fetcher
        if fetcher is None:
            return True
        if fetcher.dispatching or self.assignment is None or not self.assignment.joined:
            return False  # not part of the group yet: nothing is known
        return fetcher.read_everything(publisher.sent_end if publisher else {})

    @property
    def elapsed(self) -> float:
        """Seconds the worker has been running (or ran)."""
        if self.started_at is None:
            return 0.0
        end = self.stopped_at if self.stopped_at is not None else self.clock.monotonic()
        return max(end - self.started_at, 0.0)

    def summary(self) -> str:
        """One line: records processed and the rate; if records failed, how many, and the
        most frequent failure with where in the user's code it happened."""
        seconds = self.elapsed
        rate = self.records_in / seconds if seconds > 0 else 0.0
        records = count(self.records_in, "record")
        line = f"processed {records} in {seconds:.1f} s ({count(rate, 'record', fmt=',.0f')}/s)"
        if self.dispatcher is None:
            return line
        return line + self.dispatcher.failure_summary()


def _fenced(exc: BaseException | None) -> bool:
    return isinstance(exc, TransactionAborted) and exc.fenced


def _log_fenced(task: str, exc: BaseException) -> None:
    log.warning(
        "fenced: another worker took over this worker's partitions; stopping "
        "its tasks (nothing since the last commit counts)",
        task=task,
        error=str(exc),
    )
