"""Running agents: their streams, their outputs, and what happens when a record fails.

The ``Dispatcher`` owns every agent instance of a worker. For each record it routes the
outputs (topics through the worker's producer, other sinks through a ``SinkRunner``
each), and when processing raises it applies the agent's ``ErrorPolicy``: retry the
record after a backoff, dead-letter it, skip it, or stop the worker. A record dead-lettered
or skipped is also counted by the instance's ``FailureCounter`` (its agent's
``FailureGuard``), which stops the worker, or pauses the instance, when nearly every
record fails.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..agents import Agent
from ..app import App
from ..clock import Clock
from ..deadletter import dead_letter_topic
from ..errors import (
    DecodeError,
    DefinitionError,
    FutureRecord,
    LateRecord,
    NotRunningError,
    RecordRejected,
    SinkError,
    TooManyFailures,
    TransportError,
)
from ..metrics import Metrics
from ..policies import Retry
from ..records import Message
from ..scope import TaskScope, enter_scope
from ..sinks import SinkRunner
from ..streams import Barrier, Stream, StreamSource
from ..topics import Topic
from .emitter import Emitter
from .guards import FailureCounter
from .letters import Letter, LetterSender, log_failure, stage_of
from .logbudget import LogBudget
from .publisher import Publisher
from .routes import Route
from .targets import Targets

__all__ = ["Dispatcher"]

log = structlog.get_logger(__name__)

SendBytes = Callable[..., Awaitable[Any]]
Spawn = Callable[[Any, str], Any]


class Dispatcher:
    """Drives the agent instances of one worker."""

    def __init__(
        self,
        app: App,
        *,
        scope: TaskScope,
        send: SendBytes,
        clock: Clock,
        metrics: Metrics,
        fail_fast: bool,
        queue_batches: int,
        spawn: Spawn,
        publisher: Publisher,
    ) -> None:
        self.app = app
        # The producer's limit: dead letters fit in it.
        self.max_record_bytes = publisher.max_record_bytes
        self._send = send
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
        self._retrying: dict[str, tuple[Message, int]] = {}  # instance -> (record, attempts)
        self._reported: dict[str, int] = {}
        # Per agent instance (its source's name), if its agent has a failure guard.
        self.guards: dict[str, FailureCounter] = {}
        self._paused = 0  # instances in a pause of their guard
        default_dlq = dead_letter_topic(app.name)
        for agent in app.agents:
            topics = [t if isinstance(t, Topic) else app.topics.get(t) for t in agent.topics]
            if None in topics:
                raise DefinitionError(f"agent {agent.name!r} reads an undeclared topic")
            sources = [
                StreamSource(
                    f"{agent.name}[{i}]" if agent.concurrency > 1 else agent.name,
                    queue_batches,
                    stores=scope.stores,
                    sender=scope.sender,
                    now_ms=scope.now_ms,
                    clock=clock,
                )
                for i in range(agent.concurrency)
            ]
            for s in sources:
                s.hops = agent.hops
                s.join = agent.join
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
                counter = None
                if guard is not None:
                    counter = FailureCounter(agent.name, s.name, guard, s.reached, trips)
                    self.guards[s.name] = counter
                # A record that does not decode is the input's fault, unless the guard
                # counts them: then it is handed the counter, else it adds to ``inputs``.
                counts = counter is not None and not counter.ignores(DecodeError)
                s.undecodable = functools.partial(self._undecodable, agent, s, counter, counts)
            self._dlq[agent.name] = agent.dead_letter or default_dlq
        self.default_dlq = default_dlq
        for dlq in self.dead_letter_topics():
            publisher.lane(dlq)  # known before the first dead letter: placed at once
        publisher.before_flush = self._before_flush  # dead letters are built in batches

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
        then = runner.retry.then
        if self.fail_fast or then == "stop":
            raise error
        if then == "skip":
            for _, origin in batch:
                if origin is not None:
                    self.metrics.skipped.labels(origin.agent).inc()
            return
        for _, origin in batch:
            if origin is not None:
                message, agent = origin.message, origin.agent
                await self.letters.send(
                    message,
                    error,
                    stage="sink",
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

    def _before_flush(self) -> None:
        # Before each flush of the publisher: the noted dead letters are built and placed,
        # and the failures counted since go to the metrics.
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
            except DefinitionError as exc:
                # A mistake in the agent's code (an operator's argument, a table written off
                # its partition): not the record's fault, and no restart mends it. Fatal.
                if str(exc).startswith(f"agent {agent.name!r}"):
                    raise
                raise _of_agent(agent, exc) from exc
            except (asyncio.CancelledError, NotRunningError, TooManyFailures):
                # State this worker no longer holds: not the record's fault either. Or the
                # agent failed on too many records: the worker stops.
                raise
            except TransportError as exc:
                if not isinstance(exc, RecordRejected):
                    raise  # the broker is away: retried by a restart, not the record's fault
                await self._failed_or_raise(agent, source, exc)
                continue
            except Exception as exc:
                if source.chunk is not None:  # a batches() list failed: all its records
                    for origin in source.chunk:
                        await self._failed(agent, source, origin, exc, retry=False)
                    source.release_chunk()
                    continue
                message = source.current_message()
                if message is None:
                    if self.fail_fast:
                        raise
                    log.error(
                        "agent crashed outside a record; restarting",
                        agent=agent.name,
                        error=repr(exc),
                        backoff=backoff,
                    )
                    await asyncio.sleep(backoff)  # real time: nothing to do with event time
                    backoff = min(backoff * 2, 5.0)
                    continue
                await self._failed(agent, source, message, exc)
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

    async def _drive_per_record(self, agent: Agent[Any], source: StreamSource) -> None:
        # A record that fails is dead-lettered (or skipped) here, and the loop goes on: no
        # restart. One that is retried, or stops the worker, is drive's to handle.
        emitter = self.emitters[source.name]
        handling: dict[type, bool | None] = {}  # by exception class: see ``_handling``
        dead_letter, relieve = self._dead_letter, self.publisher.relieve
        counter = self.guards.get(source.name)
        inputs: dict[type, bool] = {}  # by class: the guard's ``ignores``, asked once

        async def failed(exc: Exception) -> bool:
            message = source.current_message()
            if message is None:
                return False
            try:
                how = handling[exc.__class__]
            except KeyError:
                how = handling[exc.__class__] = self._handling(agent, exc)
            if how is None:
                return False
            if not how:
                await self._failed(agent, source, message, exc)
                return True
            # Counted first: a guard that stops the worker raises, and the record that
            # tripped it is not dead-lettered. Bad input is counted apart without a call.
            pause = 0.0
            if counter is not None:
                kind = exc.__class__
                ignored = inputs.get(kind)
                if ignored is None:
                    ignored = inputs[kind] = counter.ignores(kind)
                if ignored:
                    counter.inputs += 1
                else:
                    pause = counter.failed(exc, message)
            if dead_letter(agent.name, source, message, exc, stage_of(exc)):
                await relieve()
            if pause:
                await self._pause(pause)
            return True

        # The stream's loop calls the function itself: no generator step per record.
        await source.call_each(agent.fn, emitter, failed, is_async=agent.is_async, many=agent.many)

    def _handling(self, agent: Agent[Any], exc: Exception) -> bool | None:
        # Raised (None), left to ``_failed`` (False), or dead-lettered in ``failed()`` (True,
        # one coroutine, not three) where ``_failed`` would do nothing else. By class.
        if not self._in_place(agent, exc):
            return None
        special = DecodeError | RecordRejected | LateRecord | FutureRecord
        return agent.on_error.action_for(exc) == "dead_letter" and not isinstance(exc, special)

    def _in_place(self, agent: Agent[Any], exc: Exception) -> bool:
        # Whether a per-record agent's failed record is dealt with where it failed: not
        # if it is to be retried or stop the worker, nor for errors that are not the
        # record's fault (a wrong declaration, the broker away).
        if self.fail_fast or isinstance(exc, DefinitionError | NotRunningError | TransportError):
            return False
        action = agent.on_error.action_for(exc)
        return action == "dead_letter" or action == "skip"

    async def _undecodable(
        self,
        agent: Agent[Any],
        source: StreamSource,
        counter: FailureCounter | None,
        counts: bool,
        exc: Exception,
    ) -> bool:
        # The current record of ``source`` does not decode: dead-lettered where the stream
        # found it, so the agent goes on without being restarted (True); with fail_fast it
        # raises through the agent instead (False). ``_failed``'s steps for a DecodeError.
        message = source.current_message()
        if self.fail_fast or message is None:
            return False
        if not isinstance(exc, DecodeError):
            await self._failed(agent, source, message, exc, retry=False)
            return True
        pause = 0.0
        if counts:
            pause = counter.failed(exc, message)  # type: ignore[union-attr]
        elif counter is not None:
            counter.inputs += 1  # the input's fault: no bug of the agent's
        if self._decode_owner.get(message.topic, agent.name) != agent.name:
            pass  # the topic's first reader dead-letters it; the others pass it by
        elif self._dead_letter(agent.name, source, message, exc, "decode"):
            await self.publisher.relieve()
        if pause:
            await self._pause(pause)
        return True

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

    def _count(self, source: StreamSource, exc: Exception, message: Message) -> float:
        # The instance's failure guard counts the record: the seconds to pause after it,
        # or TooManyFailures raised. (The hot paths, a per-record agent's failures and
        # records that do not decode, hold their counter and count bad input themselves.)
        counter = self.guards.get(source.name)
        return 0.0 if counter is None else counter.failed(exc, message)

    def _dead_letter(
        self, name: str, source: StreamSource, message: Message, exc: Exception, stage: str
    ) -> bool:
        # ``_failed``'s steps for a dead letter where none of its other cases apply. Not a
        # coroutine: True when the publisher is full (the caller awaits its ``relieve``).
        attempts = 1
        previous = self._retrying.pop(source.name, None)
        if previous is not None and previous[0] is message:
            attempts = previous[1] + 1  # the retries of an earlier error of this record
        self._errors[name, stage] = self._errors.get((name, stage), 0) + 1
        kind = (name, exc.__class__)
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if self.log_budget.allow(name):
            self._log_failure(kind, stage, "dead_letter", message, attempts, exc)
        return self.letters.note(
            message, exc, stage=stage, agent=name, attempts=attempts, topic=self._dlq[name]
        )

    def _log_failure(
        self,
        kind: tuple[str, type],
        stage: str,
        action: Any,
        message: Message,
        attempts: int,
        exc: BaseException,
    ) -> None:
        # The failure's line, and where in the user's code this kind failed, for the summary.
        at = log_failure(kind[0], stage, action, message, attempts, exc)
        if at is not None:
            self.failed_at.setdefault(kind, at)

    async def _failed_or_raise(
        self, agent: Agent[Any], source: StreamSource, exc: RecordRejected
    ) -> None:
        # An output of the current record was refused for good: that record failed.
        message = source.current_message()
        if message is None:
            raise exc  # sent outside any record: nothing to dead-letter in its place
        await self._failed(agent, source, message, exc)

    # -- failures -------------------------------------------------------------------------

    async def _failed(
        self,
        agent: Agent[Any],
        source: StreamSource,
        message: Message,
        exc: Exception,
        *,
        retry: bool = True,
    ) -> None:
        stage = stage_of(exc)
        action = agent.on_error.action_for(exc)
        if isinstance(exc, DecodeError):
            if self._decode_owner.get(message.topic, agent.name) != agent.name:
                # The topic's first reader dead-letters it; the others pass it by.
                if not self.fail_fast and (pause := self._count(source, exc, message)):
                    await self._pause(pause)
                return
            action = "dead_letter"  # bytes that do not decode never will: no retry, no skip
        if isinstance(exc, RecordRejected):
            stage, retry = "output", False  # refused for good: a retry meets the same refusal
        if isinstance(action, Retry) and not retry:
            action = action.then  # a whole batches() list cannot be replayed in place
        attempts = 1
        previous = self._retrying.get(source.name)
        if previous is not None and previous[0] is message:
            attempts = previous[1] + 1
        if isinstance(action, Retry):
            if attempts < action.attempts:
                delay = action.delay(attempts)
                self._retrying[source.name] = (message, attempts)
                self.metrics.retries.labels(agent.name).inc()
                log.warning(
                    "record failed; retrying",
                    agent=agent.name,
                    topic=message.topic,
                    partition=message.partition,
                    offset=message.offset,
                    attempt=attempts,
                    delay=round(delay, 3),
                    error=repr(exc),
                )
                # Real time, like the sinks' retries: what failed needs time to recover.
                await asyncio.sleep(delay)
                source.retry_current()
                return
            action = action.then
        self._retrying.pop(source.name, None)
        pause = 0.0
        if not self.fail_fast and action != "stop":
            # Before the record is dealt with: a guard that stops the worker raises, and
            # leaves the record that tripped it uncommitted.
            pause = self._count(source, exc, message)
        where = (agent.name, stage)
        self._errors[where] = self._errors.get(where, 0) + 1
        kind = (agent.name, exc.__class__)
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if isinstance(exc, LateRecord | FutureRecord):
            reason = "late" if isinstance(exc, LateRecord) else "future"
            self.metrics.window_rejected.labels(agent.name, reason).inc()
        if self.fail_fast or action == "stop" or self.log_budget.allow(agent.name):
            self._log_failure(kind, stage, action, message, attempts, exc)
        if self.fail_fast or action == "stop":
            self._move_errors()  # the worker stops: counted now
            raise exc
        if action == "skip":
            self.metrics.skipped.labels(agent.name).inc()
        else:
            await self.letters.send(
                message,
                exc,
                stage=stage,
                agent=agent.name,
                attempts=attempts,
                topic=self._dlq[agent.name],
            )
        if pause:
            await self._pause(pause)

    async def rejected(self, origin: Any, exc: RecordRejected) -> None:
        """The broker refused, for good, a send this dispatcher made (``origin`` says
        which): an agent output fails its record, as the agent's error policy says; a
        dead letter is sent again without its value, or, refused again, logged and
        counted."""
        if isinstance(origin, Letter):
            await self.letters.refused(origin, exc)
            return
        message, name = origin.message, origin.agent
        agent = self._agents[name]
        action = agent.on_error.action_for(exc)
        if isinstance(action, Retry):
            action = action.then  # the record is past: it cannot be processed again
        self._counter(self.metrics.errors, name, "output").inc()
        if self.fail_fast or action == "stop" or self.log_budget.allow(name):
            log.error(
                "output refused by the broker",
                agent=name,
                action=action,
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                error=str(exc),
            )
        if self.fail_fast or action == "stop":
            raise exc
        if action == "skip":
            self.metrics.skipped.labels(name).inc()
            return
        await self.letters.send(message, exc, stage="output", agent=name, topic=self._dlq[name])


def _of_agent(agent: Agent[Any], exc: DefinitionError) -> DefinitionError:
    """``exc``, its line naming the agent whose code made the mistake."""
    return DefinitionError(f"agent {agent.name!r}: {exc}")
