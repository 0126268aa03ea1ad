"""Running agents: their streams, their outputs, and what happens when a record fails.

The ``Dispatcher`` owns every agent instance of a worker. For each record it routes the
outputs (topics through the worker's producer, other sinks through a ``SinkRunner``
each), and when a record fails it does what ``failures.decide`` answers from the agent's
``ErrorPolicy``: retry the record after a backoff, dead-letter it, skip it, or stop the
worker. A record dead-lettered or skipped is also counted by the instance's
``FailureCounter`` (its agent's ``FailureGuard``), which stops the worker, or pauses the
instance, when nearly every record fails.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, NoReturn

import structlog

from ..._text import count as plural
from ...agents import Agent
from ...app import App
from ...clock import Clock
from ...deadletter import dead_letter_topic
from ...errors import DecodeError, DefinitionError, RecordRejected, SinkError
from ...metrics import Metrics
from ...records import Message, TopicPartition
from ...scope import TaskScope, enter_scope
from ...sinks import SinkRunner
from ...streams import Barrier, Stream, StreamSource
from ...topics import Topic
from ..letters.sending import Letter, LetterSender, log_failure
from ..observe.logbudget import LogBudget
from ..output.emitter import Emitter
from ..output.publisher import Publisher
from ..output.targets import Targets
from .failures import Decision, Where, decide
from .guards import FailureCounter
from .routes import Route

__all__ = ["Dispatcher"]

log = structlog.get_logger(__name__)

Spawn = Callable[[Any, str], Any]


class Dispatcher:
    """Drives the agent instances of one worker."""

    def __init__(
        self,
        app: App,
        *,
        scope: TaskScope,
        clock: Clock,
        metrics: Metrics,
        fail_fast: bool,
        queue_batches: int,
        spawn: Spawn,
        publisher: Publisher,
        on_drained: Callable[[], None] | None = None,
        behind: Callable[[TopicPartition], bool] = lambda tp: False,
        exactly_once: bool = False,
    ) -> None:
        self.app = app
        # The producer's limit: dead letters fit in it.
        self.max_record_bytes = publisher.max_record_bytes
        self.publisher = publisher  # outputs and dead letters: buffered, sent in batches
        self._spawn = spawn
        self.clock = clock
        self.metrics = metrics
        self.fail_fast = fail_fast
        self.routes: dict[str, Route] = {}
        self.sources: list[tuple[Agent[Any], StreamSource]] = []
        self.targets = Targets(app, on_give_up=self._sink_gave_up, spawn=spawn)
        self.runners = self.targets.runners  # id(sink) -> its runner, shared by agents
        self.emitters: dict[str, Emitter] = {}  # per agent instance (its source's name)
        self._dlq: dict[str, str] = {}
        self._children: dict[tuple[Any, ...], Any] = {}  # (metric, *labels) -> counter
        # Failed records per (agent, stage) not in the metric yet: moved at the next flush
        # of the publisher or checkpoint, not one Prometheus increment per record.
        self._errors: dict[tuple[str, str], int] = {}
        # For the summary at the end: failed records per (agent, error type), and where in
        # the user's code each kind failed (as its first logged line found).
        self.failures: dict[tuple[str, type], int] = {}
        self.failed_at: dict[tuple[str, type], str] = {}
        # A burst of failing records logs its first lines, then one line per checkpoint.
        self.log_budget = LogBudget(clock.monotonic)
        self.letters = LetterSender(
            publisher=publisher,
            default_topic=dead_letter_topic(app.name),
            clock=clock,
            metrics=metrics,
            counter=self._counter,
            log_budget=self.log_budget,
            fail_fast=fail_fast,
        )
        self._agents = {agent.name: agent for agent in app.agents}
        # topic -> the agent that dead-letters its records that do not decode: the first
        # declared reader, so that a bad record makes one dead letter, not one per reader.
        self._decode_owner: dict[str, str] = {}
        self._instances: dict[str, StreamSource] = {}  # by name
        self._retrying: dict[str, tuple[Message, int]] = {}  # instance -> (record, attempts)
        self._reported: dict[str, int] = {}
        # Per agent instance (its source's name), if its agent has a failure guard.
        self.guards: dict[str, FailureCounter] = {}
        # Per agent instance, its records that do not decode: the decisions for the topics
        # it owns and for the others, by exception class (``decide`` is pure: once each).
        self._undecided: dict[str, tuple[dict[type, Decision], dict[type, Decision]]] = {}
        self._paused = 0  # instances in a pause of their guard
        default_dlq = dead_letter_topic(app.name)
        for agent in app.agents:
            topics = [t if isinstance(t, Topic) else app.topics.get(t) for t in agent.topics]
            if None in topics:
                raise DefinitionError(f"agent {agent.name!r} reads an undeclared topic")
            names = [agent.name]
            if agent.concurrency > 1:
                names = [f"{agent.name}[{i}]" for i in range(agent.concurrency)]
            sources = [
                StreamSource(
                    name,
                    queue_batches,
                    stores=scope.stores,
                    sender=scope.sender,
                    now_ms=scope.now_ms,
                    clock=clock,
                    undecodable=functools.partial(self._undecodable, agent, name),
                    on_drained=on_drained,
                    behind=behind,
                    hops=agent.hops,
                    join=agent.join,
                    exactly_once=exactly_once,
                    agent=agent.name,
                )
                for name in names
            ]
            # An agent over several topics: partition p of each goes to the same instance.
            for topic in topics:
                assert topic is not None
                self.routes.setdefault(topic.name, Route(topic)).readers.append((agent, sources))
                self._decode_owner.setdefault(topic.name, agent.name)
            self.sources.extend((agent, s) for s in sources)
            targets = [self.targets.resolve(agent, s) for s in agent.sinks]
            guard = agent.guard_in(app.failure_guard)
            trips = functools.partial(self._guard_tripped, agent.name)
            for s in sources:
                self.emitters[s.name] = Emitter(agent, s, targets, self.targets, publisher)
                self._instances[s.name] = s
                self._undecided[s.name] = ({}, {})
                if guard is not None:
                    counter = FailureCounter(agent.name, s.name, guard, s.reached, trips)
                    self.guards[s.name] = counter
            self._dlq[agent.name] = agent.dead_letter or default_dlq
        self.default_dlq = default_dlq
        for dlq in self.dead_letter_topics():
            publisher.lane(dlq)  # known before the first dead letter: placed at once

    @property
    def outputs(self) -> dict[str, int]:
        """Outputs sent so far, per agent."""
        out = {agent.name: 0 for agent in self.app.agents}
        for emitter in self.emitters.values():
            out[emitter.agent.name] += emitter.count
        return out

    def dead_letter_topics(self) -> set[str]:
        """Every dead-letter topic the agents use."""
        return {self.default_dlq, *self._dlq.values()}

    # -- sinks ----------------------------------------------------------------------------

    async def _sink_gave_up(
        self,
        runner: SinkRunner,
        batch: list[tuple[Any, Any]],
        exc: BaseException,
        attempts: int,
    ) -> None:
        error = SinkError(f"sink {runner.name} failed after {attempts} attempts: {exc!r}")
        error.__cause__ = exc
        decision = decide(SinkError, runner.retry.then, fail_fast=self.fail_fast, at="past")
        if decision.verb == "stop":
            raise error
        for _, origin in batch:
            if origin is None:
                continue
            message, agent = origin.message, origin.agent
            if decision.verb == "skip":
                self.metrics.skipped.labels(agent).inc()
                continue
            await self.letters.send(
                message,
                error,
                stage=decision.stage,
                agent=agent,
                attempts=attempts,
                topic=self._dlq.get(agent, self.default_dlq),
            )

    def start_sinks(self) -> None:
        """Start every sink's writer task under the worker's supervisor (so a sink whose
        dead letters cannot be written stops the worker)."""
        self.targets.started = True
        for runner in self.runners.values():
            runner.start(self._spawn)

    async def flush_sinks(self) -> None:
        """Wait until every output handed to a sink so far is written or dead-lettered."""
        for runner in self.runners.values():
            await runner.flush()

    def sinks_busy(self) -> bool:
        """True while any sink has outputs queued or being written."""
        return any(runner.pending() for runner in self.runners.values())

    def report(self) -> None:
        """Move per-agent counts into Prometheus, once per checkpoint, not per record."""
        self._move_errors()
        reported = self._reported
        for agent, source in self.sources:
            done = source.records - reported.get(source.name, 0)
            if done:
                self.metrics.records_processed.labels(agent.name).inc(done)
                reported[source.name] = source.records
            self.metrics.queue_depth.labels(source.name).set(source.pending())
        for name, count in self.outputs.items():
            sent = count - reported.get(f"out:{name}", 0)
            if sent:
                self.metrics.outputs.labels(name).inc(sent)
                reported[f"out:{name}"] = count
        for kind, count in self.log_budget.summary().items():
            log.error(
                "more records failed than logged; see the metrics and the dead letters",
                kind=kind,
                not_logged=count,
            )

    def before_flush(self) -> None:
        """Before each flush of the publisher: the noted dead letters are built and
        placed, and the failures counted since go to the metrics."""
        self.letters.build()
        self._move_errors()

    def _move_errors(self) -> None:
        errors, self._errors = self._errors, {}
        for (agent, stage), count in errors.items():
            self._counter(self.metrics.errors, agent, stage).inc(count)

    def _guard_tripped(self, agent: str, action: str) -> None:
        self._counter(self.metrics.guard_trips, agent, action).inc()

    def _counter(self, metric: Any, *labels: str) -> Any:
        # A failing record's counters, looked up once per label set, not per record.
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def failure_summary(self) -> str:
        """``Worker.summary``'s part on failed records: how many, and the most frequent
        failure with where in the user's code it happened ("" if none failed)."""
        if not self.failures:
            return ""
        (agent, error), most = max(self.failures.items(), key=lambda item: item[1])
        at = self.failed_at.get((agent, error))
        where = f" at {at}" if at is not None else ""
        return (
            f"; {plural(sum(self.failures.values()), 'record')} failed, most often "
            f"{error.__name__} in agent {agent!r}{where} ({most:,})"
        )

    def busy(self) -> bool:
        """True while an agent has a batch or a sink has outputs to write."""
        return self.sinks_busy() or any(source.busy() for _, source in self.sources)

    def parked(self) -> int:
        """Batches held by ``take()`` lists that wait for the clock or for records."""
        return sum(source.parked() for _, source in self.sources)

    def barrier(self) -> tuple[Barrier, list[StreamSource]]:
        """A ``Barrier`` for every agent instance still reading, and those instances
        (exactly-once checkpoints queue it behind their batches: see ``Checkpointer``)."""
        live = [source for _, source in self.sources if not source.closed]
        return Barrier(len(live)), live

    async def aclose_sinks(self) -> None:
        """Stop the writers and close the sinks."""
        for runner in self.runners.values():
            await runner.aclose()

    # -- agents ---------------------------------------------------------------------------

    async def drive(self, agent: Agent[Any], source: StreamSource) -> None:
        """Run one agent instance until its stream ends, restarting it after errors."""
        enter_scope(source)  # once per task: tables find the agent's stream through it
        backoff = 0.1
        while True:
            before = source.marker()
            try:
                if agent.per_record:
                    await self._drive_per_record(agent, source)
                elif agent.yields:
                    emit = self.emitters[source.name].emit
                    async for out in agent.fn(Stream(source)):
                        pending = emit(out)
                        if pending is not None:  # a sink to feed, or the publisher is full
                            await pending
                else:
                    await agent.fn(Stream(source))
            except Exception as exc:
                if not await self._raised(agent, source, exc):
                    log.error(
                        "agent crashed outside a record; restarting",
                        agent=agent.name,
                        error=repr(exc),
                        backoff=backoff,
                    )
                    await asyncio.sleep(backoff)  # real time: nothing to do with event time
                    backoff = min(backoff * 2, 5.0)
                continue
            self._retrying.pop(source.name, None)
            if source.holds_chunk():
                source.release_chunk()  # the agent left a batches() loop: its list is done
            if source.ended():
                return
            if source.marker() == before:
                await asyncio.sleep(backoff)  # returned without reading: don't spin
                backoff = min(backoff * 2, 5.0)
            log.warning(
                "agent returned before its stream ended; starting it again", agent=agent.name
            )

    async def _raised(self, agent: Agent[Any], source: StreamSource, exc: Exception) -> bool:
        # The agent raised ``exc``: what it was on is dealt with as ``decide`` says. False
        # when it raised between records (it is started again after a backoff); raises
        # what stops the worker.
        chunk = source.chunk
        if chunk is not None and not isinstance(exc, RecordRejected):
            for origin in chunk:  # a batches() list failed: all its records
                await self._failed(agent, source, origin, exc, at="list")
            source.release_chunk()
            return True
        message = source.current_message()
        if message is not None:
            await self._failed(agent, source, message, exc)
            return True
        action = agent.on_error.action_for(exc)
        if decide(exc.__class__, action, fail_fast=self.fail_fast, at="between").verb == "raise":
            _raise(agent, exc)
        return False

    async def _drive_per_record(self, agent: Agent[Any], source: StreamSource) -> None:
        # A record that fails is dead-lettered (or skipped) here, and the loop goes on: no
        # restart. One that is retried, or stops the worker, is drive's to handle.
        emitter = self.emitters[source.name]
        name, instance, policy, fail_fast = agent.name, source.name, agent.on_error, self.fail_fast
        decided: dict[type, Decision] = {}  # by exception class, for a first failure
        settle, relieve, attempt = self._settle, self.publisher.relieve, self._attempt
        retrying = self._retrying  # while empty, a failure is a record's first: no call
        counter = self.guards.get(source.name)
        inputs: dict[type, bool] = {}  # by class: the guard's ``ignores``, asked once

        async def failed(exc: Exception, record: Any) -> bool:
            # The loop hands over the record it was on, as its batch holds it: a Message
            # needs no asking the cursor, a client's own record is made one there.
            message = record if record.__class__ is Message else source.current_message()
            if message is None:
                return False
            kind = exc.__class__
            try:
                decision = decided[kind]
            except KeyError:
                action = policy.action_for(exc)
                if issubclass(kind, DecodeError):  # its owner depends on the record's topic
                    owner = self._decode_owner.get(message.topic, name) == name
                    decision = decide(kind, action, owner=owner, fail_fast=fail_fast)
                else:  # kept: only a Retry's attempts change it then, and a retry is drive's
                    decision = decided[kind] = decide(kind, action, fail_fast=fail_fast)
            if not decision.settles:
                return False  # retried, or the worker stops: drive's
            # Counted first: a guard that stops the worker raises, and the record that
            # tripped it is not dead-lettered. Bad input is counted apart without a call.
            pause = 0.0
            if counter is not None and decision.counted:
                ignored = inputs.get(kind)
                if ignored is None:
                    ignored = inputs[kind] = counter.ignores(kind)
                if ignored:
                    counter.inputs += 1
                else:
                    pause = counter.failed(exc, message)
            tries = attempt(instance, message) if retrying else 1
            if settle(name, message, exc, tries, decision):
                await relieve()
            if pause:
                await self._pause(pause)
            return True

        # The stream's loop calls the function itself: no generator step per record.
        await source.call_each(agent.fn, emitter, failed, is_async=agent.is_async, many=agent.many)

    async def _undecodable(self, agent: Agent[Any], name: str, exc: Exception) -> None:
        # The current record of the instance ``name`` failed where its stream found it (it
        # does not decode, a join found it too late, an operator of a list's chain raised):
        # dealt with there, so the agent goes on without being started again; else ``exc``
        # is raised, through the agent.
        source = self._instances[name]
        message = source.current_message()
        if message is None:
            raise exc from None
        owned, others = self._undecided[name]
        known = owned if self._decode_owner.get(message.topic, agent.name) == agent.name else others
        kind = exc.__class__
        decision = known.get(kind)
        if decision is None:
            decision = known[kind] = decide(
                kind,
                agent.on_error.action_for(exc),
                owner=known is owned,
                fail_fast=self.fail_fast,
                at="list",
            )
        if not decision.settles:
            raise exc from None
        counter = self.guards.get(name)
        pause = 0.0
        if counter is not None and decision.counted:
            pause = counter.failed(exc, message)
        if self._settle(agent.name, message, exc, self._attempt(name, message), decision):
            await self.publisher.relieve()
        if pause:
            await self._pause(pause)

    async def _pause(self, seconds: float) -> None:
        # An instance whose guard tripped with action "pause". Real time, as a retry's
        # wait: what makes every record fail (a service away) needs time to come back.
        self._paused += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self._paused -= 1

    @property
    def pausing(self) -> bool:
        """True while an agent instance pauses after too many failures (its guard)."""
        return self._paused > 0

    # -- failures: ``decide`` says what happens, these do it ------------------------------

    def _attempt(self, name: str, message: Message) -> int:
        # Which failure of ``message`` this is: 1, or one more than its retries so far.
        previous = self._retrying.pop(name, None)
        if previous is not None and previous[0] is message:
            return previous[1] + 1
        return 1

    async def _failed(
        self,
        agent: Agent[Any],
        source: StreamSource,
        message: Message,
        exc: Exception,
        *,
        at: Where = "record",
    ) -> None:
        attempt = self._attempt(source.name, message)
        decision = decide(
            exc.__class__,
            agent.on_error.action_for(exc),
            attempt=attempt,
            owner=self._decode_owner.get(message.topic, agent.name) == agent.name,
            fail_fast=self.fail_fast,
            at=at,
        )
        if decision.verb == "raise":
            _raise(agent, exc)
        if decision.verb == "retry":
            assert decision.retry is not None
            await self._retry(agent.name, source, message, exc, attempt, decision.retry.delay)
            return
        pause = 0.0
        counter = self.guards.get(source.name)
        if counter is not None and decision.counted:
            # Before the record is dealt with: a guard that stops the worker raises, and
            # leaves the record that tripped it uncommitted.
            pause = counter.failed(exc, message)
        if self._settle(agent.name, message, exc, attempt, decision):
            await self.publisher.relieve()
        if pause:
            await self._pause(pause)

    async def _retry(
        self,
        name: str,
        source: StreamSource,
        message: Message,
        exc: Exception,
        attempt: int,
        delay_of: Callable[[int], float],
    ) -> None:
        delay = delay_of(attempt)
        self._retrying[source.name] = (message, attempt)
        self.metrics.retries.labels(name).inc()
        log.warning(
            "record failed; retrying",
            agent=name,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            attempt=attempt,
            delay=round(delay, 3),
            error=repr(exc),
        )
        # Real time, like the sinks' retries: what failed needs time to recover.
        await asyncio.sleep(delay)
        source.retry_current()

    def _settle(
        self, name: str, message: Message, exc: Exception, attempt: int, decision: Decision
    ) -> bool:
        # A "dead_letter", "skip", "pass" or "stop" of the agent ``name``, once its guard
        # counted it. Not a coroutine: True when the publisher is full (the caller awaits
        # its ``relieve``); a stop raises ``exc``.
        verb, stage = decision.verb, decision.stage
        if verb == "pass":
            return False  # the topic's first reader dead-letters it; the others pass it by
        self._errors[name, stage] = self._errors.get((name, stage), 0) + 1
        kind = (name, exc.__class__)
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if decision.window is not None:
            self.metrics.window_rejected.labels(name, decision.window).inc()
        if verb == "stop" or self.log_budget.allow(name):
            at = log_failure(name, stage, verb, message, attempt, exc)
            if at is not None:  # where in the user's code this kind failed, for the summary
                self.failed_at.setdefault(kind, at)
        if verb == "stop":
            self._move_errors()  # the worker stops: counted now
            raise exc
        if verb == "skip":
            self.metrics.skipped.labels(name).inc()
            return False
        return self.letters.note(
            message, exc, stage=stage, agent=name, attempts=attempt, topic=self._dlq[name]
        )

    async def rejected(self, origin: Any, exc: RecordRejected) -> None:
        """The broker refused, for good, a send this dispatcher made (``origin`` says
        which): an agent output fails its record, as the agent's error policy says; a
        dead letter is sent again without its value, or, refused again, logged and
        counted."""
        if isinstance(origin, Letter):
            await self.letters.refused(origin, exc)
            return
        message, name = origin.message, origin.agent
        action = self._agents[name].on_error.action_for(exc)
        decision = decide(exc.__class__, action, fail_fast=self.fail_fast, at="past")
        self._counter(self.metrics.errors, name, decision.stage).inc()
        if decision.verb == "stop" or self.log_budget.allow(name):
            log.error(
                "output refused by the broker",
                agent=name,
                action=decision.verb,
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                error=str(exc),
            )
        if decision.verb == "stop":
            raise exc
        if decision.verb == "skip":
            self.metrics.skipped.labels(name).inc()
            return
        await self.letters.send(
            message, exc, stage=decision.stage, agent=name, topic=self._dlq[name]
        )


def _raise(agent: Agent[Any], exc: Exception) -> NoReturn:
    # An error that is not the record's fault. A mistake in the agent's code (an
    # operator's argument, a table written off its partition) names the agent.
    if isinstance(exc, DefinitionError) and not str(exc).startswith(f"agent {agent.name!r}"):
        raise DefinitionError(f"agent {agent.name!r}: {exc}") from exc
    raise exc
