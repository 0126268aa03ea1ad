"""Running agents: their streams, their outputs, and what happens when a record fails.

The ``Dispatcher`` owns every agent instance of a worker. For each record it routes the
outputs (topics through the worker's producer, other sinks through a ``SinkRunner``
each), and when processing raises it applies the agent's ``ErrorPolicy``: retry the
record after a backoff, dead-letter it, skip it, or stop the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..agents import KEEP_KEY, Agent, Output
from ..app import App
from ..clock import Clock
from ..deadletter import dead_letter_headers, dead_letter_topic, fit_dead_letter
from ..errors import (
    DecodeError,
    DefinitionError,
    FutureRecord,
    LateRecord,
    NotRunningError,
    ProcessingError,
    RecordRejected,
    SinkError,
    TransportError,
)
from ..metrics import Metrics
from ..policies import Retry
from ..records import Headers, Message
from ..scope import TaskScope, enter_scope
from ..sinks import CallableSink, Sink, SinkRunner, sink_name
from ..streams import Stream, StreamSource
from ..topics import Topic, accepts

__all__ = ["Dispatcher", "Route"]

log = structlog.get_logger(__name__)

SendBytes = Callable[..., Awaitable[Any]]
Spawn = Callable[[Any, str], Any]


@dataclass
class Route:
    """Where the batches of one topic go: per reading agent, its instances' sources."""

    topic: Topic[Any]
    readers: list[tuple[Agent[Any], list[StreamSource]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Letter:
    """The origin of a dead-letter send: what to do if the broker refuses it."""

    message: Message
    topic: str
    stage: str
    headers: Headers  # the dead letter's headers, before any truncation marks
    valueless: bool = False  # sent again without the value, after the broker refused it


@dataclass(frozen=True)
class _Target:
    topic: Topic[Any] | None = None
    runner: SinkRunner | None = None
    encode: Callable[[Any], bytes] | None = None  # the codec's own encoder: no extra frame
    checked: Any = None  # the topic's value type, when outputs are checked against it

    @classmethod
    def for_topic(cls, topic: Topic[Any]) -> _Target:
        raw = getattr(topic.value_codec, "_encoder", None)
        vt = topic.value_type
        return cls(
            topic=topic,
            encode=raw.encode if raw is not None else topic.encode,
            checked=vt if isinstance(vt, type) and vt is not object else None,
        )


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
        max_record_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.max_record_bytes = max_record_bytes  # the producer's: dead letters fit in it
        self._send = send
        self._spawn = spawn
        self._sinks_started = False
        self.clock = clock
        self.metrics = metrics
        self.fail_fast = fail_fast
        self.routes: dict[str, Route] = {}
        self.sources: list[tuple[Agent[Any], StreamSource]] = []
        self.runners: dict[int, SinkRunner] = {}  # id(sink) -> its runner, shared by agents
        self._targets: dict[str, list[_Target]] = {}
        self._dlq: dict[str, str] = {}
        self._agents = {agent.name: agent for agent in app.agents}
        # topic -> the agent that dead-letters its records that do not decode: the first
        # declared reader, so that a bad record makes one dead letter, not one per reader.
        self._decode_owner: dict[str, str] = {}
        self._retrying: dict[str, tuple[Message, int]] = {}  # instance -> (record, attempts)
        self.outputs: dict[str, int] = {a.name: 0 for a in app.agents}  # to metrics per commit
        self._reported: dict[str, int] = {}
        self._route_cache: dict[tuple[str, tuple[Any, ...]], list[_Target]] = {}
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
                s.regroups = agent.regroups
                s.join = agent.join
            # An agent over several topics: partition p of each goes to the same instance.
            for topic in topics:
                assert topic is not None
                self.routes.setdefault(topic.name, Route(topic)).readers.append((agent, sources))
                self._decode_owner.setdefault(topic.name, agent.name)
            self.sources.extend((agent, s) for s in sources)
            self._targets[agent.name] = [self._target(agent, s) for s in agent.sinks]
            self._dlq[agent.name] = agent.dead_letter or default_dlq
        self.default_dlq = default_dlq

    def dead_letter_topics(self) -> set[str]:
        """Every dead-letter topic the agents use."""
        return {self.default_dlq, *self._dlq.values()}

    # -- sinks ----------------------------------------------------------------------------

    def _target(self, agent: Agent[Any], sink: Any) -> _Target:
        if isinstance(sink, Topic):
            return _Target.for_topic(sink)
        if isinstance(sink, Agent):
            return self._target(agent, sink.topic)
        if isinstance(sink, str):
            topic = self.app.topics.get(sink)
            if topic is None:
                raise DefinitionError(f"agent {agent.name!r} writes undeclared topic {sink!r}")
            return _Target.for_topic(topic)
        runner = self.runners.get(id(sink))
        if runner is None:
            if isinstance(sink, Sink):
                wrapped: Sink = sink
            elif callable(sink):
                wrapped = CallableSink(sink)
            else:
                raise DefinitionError(
                    f"agent {agent.name!r}: {sink!r} is not a topic, agent, Sink or callable"
                )
            try:
                runner = SinkRunner(
                    wrapped,
                    name=sink_name(sink),
                    on_give_up=self._sink_gave_up,
                    **getattr(sink, "runner_options", {}),
                )
            except TypeError as exc:
                raise DefinitionError(
                    f"sink {sink_name(sink)!r}: bad runner_options ({exc})"
                ) from None
            if self._sinks_started:  # a target first named by an Output(to=...) at run time
                runner.start(self._spawn)
            self.runners[id(sink)] = runner
        return _Target(runner=runner)

    def _routed(self, agent: Agent[Any], to: Any) -> list[_Target]:
        """The targets an ``Output(to=...)`` names, resolved once per distinct ``to``."""
        chosen = tuple(to) if isinstance(to, list | tuple) else (to,)
        key = (agent.name, chosen)
        try:
            return self._route_cache[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable target: resolve it every time
            return [self._target(agent, t) for t in chosen]
        targets = self._route_cache[key] = [self._target(agent, t) for t in chosen]
        return targets

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
                    self.metrics.skipped.labels(origin[1]).inc()
            return
        for _, origin in batch:
            if origin is not None:
                message, agent = origin
                await self.dead_letter(
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
        self._sinks_started = True
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

    def busy(self) -> bool:
        """True while an agent has a batch or a sink has outputs to write."""
        return self.sinks_busy() or any(source.busy() for _, source in self.sources)

    def parked(self) -> int:
        """Batches held by ``take()`` lists that wait for the clock or for records."""
        return sum(source.parked() for _, source in self.sources)

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
                    async for out in agent.fn(Stream(source)):
                        await self.emit(agent, source, out)
                else:
                    await agent.fn(Stream(source))
            except (asyncio.CancelledError, DefinitionError, NotRunningError):
                # A wrong declaration (a table written off its partition), or state this
                # worker no longer holds: not the record's fault, so not a dead letter.
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
        fn = agent.fn
        is_async = agent.is_async
        async for value in source.iterate(()):
            out = fn(value)
            if is_async:
                out = await out
            if out is not None:
                await self.emit(agent, source, out)

    async def _failed_or_raise(
        self, agent: Agent[Any], source: StreamSource, exc: RecordRejected
    ) -> None:
        # An output of the current record was refused for good: that record failed.
        message = source.current_message()
        if message is None:
            raise exc  # sent outside any record: nothing to dead-letter in its place
        await self._failed(agent, source, message, exc)

    async def emit(self, agent: Agent[Any], source: StreamSource, out: Any) -> None:
        """Send one output to the agent's sinks (or the ones ``Output.to`` names)."""
        targets = self._targets[agent.name]
        self.outputs[agent.name] += 1
        key: Any = KEEP_KEY
        headers: Headers = ()
        value = out
        if isinstance(out, Output):
            value, key, headers = out.value, out.key, tuple(out.headers)
            if out.to is not None:
                targets = self._routed(agent, out.to)
        message = source.current_message()
        for target in targets:
            topic = target.topic
            if topic is not None:
                vt = target.checked  # a type check that costs one compare when it passes
                if (
                    vt is not None
                    and value.__class__ is not vt
                    and value is not None
                    and not accepts(vt, value.__class__)
                ):
                    raise TypeError(
                        f"agent {agent.name!r} yielded {type(value).__qualname__}, but "
                        f"topic {topic.name!r} takes {topic.value_type_name}"
                    )
                if key is KEEP_KEY:
                    raw_key = message.key if message is not None else None
                else:
                    raw_key = topic.encode_key(key)
                await self._send(
                    topic.name,
                    None if value is None else target.encode(value),  # type: ignore[misc]
                    key=raw_key,
                    headers=headers,
                    origin=None if message is None else (message, agent.name),
                )
            elif target.runner is not None:
                origin = None if message is None else (message, agent.name)
                await target.runner.submit(value, origin)

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
        stage = exc.stage if isinstance(exc, ProcessingError) else "process"
        action = agent.on_error.action_for(exc)
        if isinstance(exc, DecodeError):
            if self._decode_owner.get(message.topic, agent.name) != agent.name:
                return  # the topic's first reader dead-letters it; the others pass it by
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
        self.metrics.errors.labels(agent.name, stage).inc()
        if isinstance(exc, LateRecord | FutureRecord):
            reason = "late" if isinstance(exc, LateRecord) else "future"
            self.metrics.window_rejected.labels(agent.name, reason).inc()
        log.error(
            "record failed",
            agent=agent.name,
            stage=stage,
            action=action,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            attempts=attempts,
            error=repr(exc),
        )
        if self.fail_fast or action == "stop":
            raise exc
        if action == "skip":
            self.metrics.skipped.labels(agent.name).inc()
            return
        await self.dead_letter(
            message,
            exc,
            stage=stage,
            agent=agent.name,
            attempts=attempts,
            topic=self._dlq[agent.name],
        )

    async def dead_letter(
        self,
        message: Message,
        error: BaseException,
        *,
        stage: str,
        agent: str | None,
        attempts: int = 1,
        topic: str | None = None,
    ) -> None:
        """Send ``message`` unchanged to the dead-letter topic, with headers saying why."""
        self.metrics.dead_letters.labels(stage).inc()
        headers = dead_letter_headers(
            message,
            error,
            stage=stage,
            agent=agent,
            attempts=attempts,
            failed_at_ms=int(self.clock.time() * 1000),
        )
        topic = topic or self.default_dlq
        await self._send_letter(_Letter(message, topic, stage, headers))

    async def _send_letter(self, letter: _Letter) -> None:
        # Whole if it fits the producer's limit, else cut to fit; with no value at all
        # after the broker refused it once (its own limit may be below the producer's).
        message = letter.message
        limit = 0 if letter.valueless else self.max_record_bytes
        value, headers = fit_dead_letter(message.key, message.value, letter.headers, limit)
        try:
            await self._send(
                letter.topic,
                value,
                key=message.key,
                headers=headers,
                timestamp_ms=message.timestamp,
                origin=letter,
            )
        except RecordRejected as exc:
            await self._letter_lost(letter, exc)

    async def _letter_lost(self, letter: _Letter, exc: RecordRejected) -> None:
        message = letter.message
        self.metrics.dead_letters_lost.labels(letter.stage).inc()
        log.error(
            "dead letter refused by the broker; the record is skipped",
            dlq=letter.topic,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            error=str(exc),
        )
        if self.fail_fast:
            raise exc

    async def rejected(self, origin: Any, exc: RecordRejected) -> None:
        """The broker refused, for good, a send this dispatcher made (``origin`` says
        which): an agent output fails its record, as the agent's error policy says; a
        dead letter is sent again without its value, or, refused again, logged and
        counted."""
        if isinstance(origin, _Letter):
            if not origin.valueless and origin.message.value is not None:
                await self._send_letter(
                    _Letter(origin.message, origin.topic, origin.stage, origin.headers, True)
                )
            else:
                await self._letter_lost(origin, exc)
            return
        message, name = origin
        agent = self._agents[name]
        action = agent.on_error.action_for(exc)
        if isinstance(action, Retry):
            action = action.then  # the record is past: it cannot be processed again
        self.metrics.errors.labels(name, "output").inc()
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
        await self.dead_letter(message, exc, stage="output", agent=name, topic=self._dlq[name])
