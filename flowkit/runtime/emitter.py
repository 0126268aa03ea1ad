"""An agent instance's outputs on their way to its sinks: one ``Emitter`` per instance.

Made once, when the worker is built: it holds the agent's targets, the ``Output(to=...)``
choices already resolved, and its count of outputs, so an output costs no lookup by agent
name. A per-record agent's loop hands it each record's outputs at once, with the record
(``place``): what the outputs need of it (its origin, for a refusal; its key) is found
once per record, and the publisher is told once per record how many were placed. An
agent's ``yield`` goes through ``emit``, which asks the stream source for the record.

A topic output is placed straight into the publisher's buffer of its destination
partition (the topic's ``Lane``), with no call per output into the publisher and nothing
left to group when it flushes. What must still be awaited (a sink's submit, a full
publisher) is returned, for ``settle``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from typing import Any

from ..agents import KEEP_KEY, Agent, Output
from ..records import Headers, Message, RawMessages, headers_size
from ..sinks import SinkRunner
from ..streams import StreamSource
from ..topics import Topic, accepts
from .publisher import Lane, Publisher, settled
from .targets import Target, Targets

__all__ = ["Emitter"]

# Where one output goes, flat, so the loop over a fan-out reads no attributes:
# (lane, checked type, encode, topic) for a topic, (None, None, None, runner) for a sink.
Dest = tuple[Any, Any, Any, Any]
# What ``place`` stopped for: (sinks to submit to, the output, its origin, relieve?).
Wait = tuple[list[SinkRunner] | None, Any, Any, bool]
# Outputs of one record placed before the publisher is told (and may ask to be relieved):
# a generator of a million outputs still meets the publisher's bound.
_CHUNK = 1024


class Emitter:
    """Sends the outputs of one agent instance to its sinks."""

    __slots__ = (
        "_dests",
        "_publisher",
        "_resolver",
        "_routed",
        "agent",
        "count",
        "source",
        "targets",
    )

    def __init__(
        self,
        agent: Agent[Any],
        source: StreamSource,
        targets: list[Target],
        resolver: Targets,
        publisher: Publisher,
    ) -> None:
        self.agent = agent
        self.source = source
        self.targets = targets  # the agent's sinks
        self._resolver = resolver
        self._publisher = publisher
        self._dests = self._flat(targets)
        self._routed: dict[Any, tuple[Dest, ...]] = {}  # Output.to -> where it goes
        self.count = 0  # outputs so far: moved to the metrics once per checkpoint

    def _flat(self, targets: list[Target]) -> tuple[Dest, ...]:
        lane = self._publisher.lane
        return tuple(
            (lane(t.topic.name), t.checked, t.encode, t.topic)
            if t.topic is not None
            else (None, None, None, t.runner)
            for t in targets
        )

    def _route(self, to: Any) -> tuple[Dest, ...]:
        dests = self._flat(self._resolver.routed(self.agent, to))
        if isinstance(to, tuple | str | Topic):  # as Targets.routed: bounded, hashable
            self._routed[to] = dests
        return dests

    def emit(self, out: Any) -> Awaitable[None] | None:
        """Send one output (a value, or an ``Output``) of the record being processed to
        the agent's sinks, or to the ones ``Output.to`` names (an agent's ``yield``)."""
        wait = self.place((out,), self.source.current_record())
        return None if wait is None else self.settle(wait)

    def place(self, outs: Iterator[Any] | tuple[Any, ...], cause: Any) -> Wait | None:
        """Place the outputs ``outs`` of the record ``cause`` (as its batch holds it) in
        the publisher's lanes, in order; None when all are placed. Otherwise it stopped
        after an output that must be waited for (a sink's submit, a full publisher): ``await
        settle(wait)``, then call again with the same iterator for the rest.

        A per-record agent's loop calls this once per record, with the record at hand:
        what an output needs of its record (origin, key) is found once, not per output.
        """
        if cause.__class__ is Message:  # a list batch's (memory, aiokafka)
            kept = cause.key  # the record's key, for KEEP_KEY
            origin: Any = (cause, self.agent.name)
        elif cause is None:
            origin = kept = None
        else:
            # A client's own record (librdkafka's, in a RawMessages batch) is not made a
            # Message here: its key is read through the client, and its origin carries the
            # conversion, made only if a send is refused or a sink holds it (``settled``).
            messages: RawMessages = self.source.batch.messages  # type: ignore[union-attr,assignment]
            kept = messages.key_of(cause)
            origin = (cause, self.agent.name, messages.convert)
        publisher = self._publisher
        limit = publisher.limit
        kept_room = limit if kept is None else limit - len(kept)  # bytes left for the rest
        base, routed = self._dests, self._routed
        placed = n = 0
        relieve = False
        runners: list[SinkRunner] | None = None
        value: Any = None
        data: bytes | None = None
        size = 0
        lane: Lane | None
        try:
            for out in outs:
                n += 1
                dests = base
                key: Any = KEEP_KEY
                headers: Headers = ()
                value = out
                if out.__class__ is Output or isinstance(out, Output):
                    value = out.value
                    key = out.key
                    headers = out.headers
                    to = out.to
                    if headers.__class__ is not tuple:
                        headers = tuple(headers)
                    if to is not None:
                        try:
                            dests = routed[to]
                        except (KeyError, TypeError):  # not seen yet, or not hashable
                            dests = self._route(to)
                encode: Any = None
                for lane, vt, enc, sink in dests:
                    if lane is None:
                        if runners is None:
                            runners = []
                        runners.append(sink)
                        continue
                    # a type check that costs one compare when it passes
                    if (
                        vt is not None
                        and value.__class__ is not vt
                        and value is not None
                        and not accepts(vt, value.__class__)
                    ):
                        raise TypeError(
                            f"agent {self.agent.name!r} yielded {type(value).__qualname__}, "
                            f"but topic {sink.name!r} takes {sink.value_type_name}"
                        )
                    if enc is not encode:  # a fan-out encodes a value once
                        encode = enc
                        data = None if value is None else enc(value)
                        size = 0 if data is None else len(data)
                        if headers:
                            size += headers_size(headers)
                    if key is KEEP_KEY:
                        raw_key, room = kept, kept_room
                    else:
                        raw_key = sink.encode_key(key)
                        room = limit if raw_key is None else limit - len(raw_key)
                    parts = lane.parts
                    if parts is None or size > room:
                        # Not placed here: a topic whose partition count is not known yet,
                        # or a record the publisher refuses (with its message).
                        if placed and publisher.placed(placed):
                            relieve = True
                        placed = 0
                        if publisher.publish(lane.topic, data, raw_key, headers, origin):
                            relieve = True
                        continue
                    if raw_key is None:
                        group = parts[lane.spread]
                    else:
                        p = lane.keys.get(raw_key)
                        group = parts[lane.place(raw_key) if p is None else p]
                    group[0].append((raw_key, data, headers, None))
                    group[1].append(origin)
                    placed += 1
                if runners is not None or relieve or placed >= _CHUNK:
                    break  # to wait before the next output (or for a full publisher)
        finally:  # also when the agent raises after some outputs: those are placed
            self.count += n
            if placed and publisher.placed(placed):
                relieve = True
        if runners is None and not relieve and placed < _CHUNK:
            return None
        return runners, value, origin, relieve

    async def settle(self, wait: Wait) -> None:
        """Do what ``place`` stopped for: relieve the publisher, submit to the sinks."""
        runners, value, origin, relieve = wait
        if relieve:
            await self._publisher.relieve()
        if runners is not None:
            origin = settled(origin)  # a sink holds it: the Message is made now
            for runner in runners:
                await runner.submit(value, origin)
