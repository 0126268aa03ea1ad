"""An agent instance's outputs on their way to its sinks: one ``Emitter`` per instance.

Made once, when the worker is built: it holds the agent's targets, the ``Output(to=...)``
choices already resolved, and its count of outputs, so an output costs no lookup by agent
name. A per-record agent's loop hands it each record's outputs at once, with the record
(``place``): what the outputs need of it (its origin, for a refusal; its key) is found
once per record, and the publisher is told once per record how many were placed. An
agent's ``yield`` goes through ``emit``, which asks the stream source for the record.

A topic output is placed as its topic's ``Lane.add`` places a record (the size limit, the
key's partition by the lane's ``KeyPartitions``), written out in the loop: in the buffer of
its destination partition, with nothing left to group when the publisher flushes. What
must still be awaited (a sink's submit, a full publisher) is returned, for ``settle``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec

from ...agents import KEEP_KEY, Agent, Output
from ...records import Headers, Message, RawMessages, headers_size
from ...sinks import SinkRunner
from ...streams import StreamSource
from ...topics import Topic, accepts
from .lanes import Lane, Origin, RawOrigin, settled
from .publisher import Publisher
from .targets import Target, Targets

__all__ = ["Dest", "Emitter", "Wait"]


# Where one output goes, flat, so the loop over a fan-out reads no attributes: a topic's
# lane, the type its values are checked against, its encode function, the topic (and no
# runner); or, with no lane, a sink's runner. A plain tuple: unpacked in C per output (a
# NamedTuple is unpacked through its iterator).
Dest = tuple[
    Lane | None, type | None, Callable[[Any], bytes] | None, Topic[Any] | None, SinkRunner | None
]


class Wait(msgspec.Struct, frozen=True):
    """What ``place`` stopped for: the sinks to submit the output to, and whether the
    publisher asked to be relieved."""

    runners: list[SinkRunner] | None
    value: object
    origin: Origin | RawOrigin | None
    relieve: bool


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
        self._routed: dict[object, tuple[Dest, ...]] = {}  # Output.to -> where it goes
        self.count = 0  # outputs so far: moved to the metrics once per checkpoint

    def _flat(self, targets: list[Target]) -> tuple[Dest, ...]:
        lane = self._publisher.lane
        return tuple(
            (lane(t.topic.name), t.checked, t.encode, t.topic, None)
            if t.topic is not None
            else (None, None, None, None, t.runner)
            for t in targets
        )

    def _route(self, to: object) -> tuple[Dest, ...]:
        dests = self._flat(self._resolver.routed(self.agent, to))
        if isinstance(to, tuple | str | Topic):  # as Targets.routed: bounded, hashable
            self._routed[to] = dests
        return dests

    def emit(self, out: object) -> Awaitable[None] | None:
        """Send one output (a value, or an ``Output``) of the record being processed to
        the agent's sinks, or to the ones ``Output.to`` names (an agent's ``yield``)."""
        wait = self.place((out,), self.source.current_record())
        return None if wait is None else self.settle(wait)

    def place(self, outs: Iterator[object] | tuple[object, ...], cause: object) -> Wait | None:
        """Place the outputs ``outs`` of the record ``cause`` (as its batch holds it) in
        the publisher's lanes, in order; None when all are placed. Otherwise it stopped
        after an output that must be waited for (a sink's submit, a full publisher): ``await
        settle(wait)``, then call again with the same iterator for the rest.

        A per-record agent's loop calls this once per record, with the record at hand:
        what an output needs of its record (origin, key) is found once, not per output.
        """
        origin: Origin | RawOrigin | None
        if cause.__class__ is Message:  # a list batch's (memory, aiokafka)
            kept = cause.key  # the record's key, for KEEP_KEY
            origin = Origin(cause, self.agent.name)
        elif cause is None:
            origin = kept = None
        else:
            # A client's own record (librdkafka's, in a RawMessages batch) is not made a
            # Message here: its key is read through the client, and its origin carries the
            # conversion, made only if a send is refused or a sink holds it (``settled``).
            messages: RawMessages = self.source.batch.messages  # type: ignore[union-attr,assignment]
            kept = messages.key_of(cause)
            origin = RawOrigin(cause, self.agent.name, messages.convert)
        publisher = self._publisher
        # ``Lane.add`` written out for speed (a call per output cost ~3 % of the router's
        # instructions): ``record_size(key, value, headers) > limit`` counted in parts, a
        # value's bytes once for a fan-out, a key's once per record; ``tests/runtime/
        # test_lanes.py`` holds the two equal.
        limit = publisher.limit
        kept_room = limit if kept is None else limit - len(kept)  # bytes left for the rest
        base, routed = self._dests, self._routed
        placed = n = size = 0
        relieve = False
        runners: list[SinkRunner] | None = None
        value: Any = None
        data: bytes | None = None
        try:
            for out in outs:
                n += 1
                dests = base
                key: object = KEEP_KEY
                headers: Headers = ()
                value = out
                if out.__class__ is Output or isinstance(out, Output):
                    value, key, headers = out.value, out.key, out.headers
                    if headers.__class__ is not tuple:
                        headers = tuple(headers)
                    to = out.to
                    if to is not None:
                        try:
                            dests = routed[to]
                        except (KeyError, TypeError):  # not seen yet, or not hashable
                            dests = self._route(to)
                encode: Callable[[Any], bytes] | None = None
                for lane, checked, enc, topic, runner in dests:
                    if lane is None:
                        if runners is None:
                            runners = []
                        runners.append(runner)  # type: ignore[arg-type]
                        continue
                    # a type check that costs one compare when it passes
                    if (
                        checked is not None
                        and value.__class__ is not checked
                        and value is not None
                        and not accepts(checked, value.__class__)
                    ):
                        raise self._refused(value, topic)
                    if enc is not encode:  # a fan-out encodes and sizes a value once
                        encode = enc
                        data = None if value is None else enc(value)  # type: ignore[misc]
                        size = 0 if data is None else len(data)
                        if headers:
                            size += headers_size(headers)
                    if key is KEEP_KEY:
                        raw_key, room = kept, kept_room
                    else:
                        raw_key = topic.encode_key(key)  # type: ignore[union-attr]
                        room = limit if raw_key is None else limit - len(raw_key)
                    parts = lane.parts
                    if parts is not None and size <= room:
                        group = parts[lane.spread if raw_key is None else lane.keys[raw_key]]
                        group[0].append((raw_key, data, headers, None))
                        group[1].append(origin)
                        placed += 1
                        continue
                    # Not placed: a topic whose partition count is not known yet, or a
                    # record the publisher refuses (with its message).
                    if placed and publisher.placed(placed):
                        relieve = True
                    placed = 0
                    if publisher.publish(lane.topic, data, raw_key, headers, origin):
                        relieve = True
                if runners is not None or relieve or placed >= _CHUNK:
                    break  # to wait before the next output (or for a full publisher)
        finally:  # also when the agent raises after some outputs: those are placed
            self.count += n
            if placed and publisher.placed(placed):
                relieve = True
        if runners is None and not relieve and placed < _CHUNK:
            return None
        return Wait(runners, value, origin, relieve)

    def _refused(self, value: object, topic: Topic[Any] | None) -> TypeError:
        assert topic is not None  # a lane is a topic's
        return TypeError(
            f"agent {self.agent.name!r} yielded {type(value).__qualname__}, "
            f"but topic {topic.name!r} takes {topic.value_type_name}"
        )

    async def settle(self, wait: Wait) -> None:
        """Do what ``place`` stopped for: relieve the publisher, submit to the sinks."""
        if wait.relieve:
            await self._publisher.relieve()
        if wait.runners is not None:
            origin = settled(wait.origin)  # a sink holds it: the Message is made now
            for runner in wait.runners:
                await runner.submit(wait.value, origin)
