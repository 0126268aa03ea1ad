"""An agent instance's outputs on their way to its sinks: one ``Emitter`` per instance.

Made once, when the worker is built: it holds the agent's targets, the ``Output(to=...)``
choices already resolved, and its count of outputs, so an output costs no lookup by agent
name. A per-record agent's loop hands it each record's outputs at once, with the record
(``place``): what the outputs need of it (its origin, for a refusal; its key) is found
once per record, and the publisher is told once per record how many were placed. An
agent's ``yield`` goes through ``emit``, which asks the stream source for the record.

A topic output is placed as its topic's ``Lane.add`` places a record (the size limit, the
key's partition by the lane's ``KeyPartitions``), in the buffer of its destination
partition, with nothing left to group when the publisher flushes: ``place`` is compiled
with the lane's rule written in (``fanout.py``). What must still be awaited (a sink's
submit, a full publisher) is returned, for ``settle``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from ...agents import Agent
from ...sinks import SinkRunner
from ...streams import StreamSource
from ...topics import Topic
from .fanout import place_outputs
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

    if TYPE_CHECKING:

        def place(self, outs: Iterator[object] | tuple[object, ...], cause: object) -> Wait | None:
            """Place the outputs ``outs`` of the record ``cause`` (as its batch holds it)
            in the publisher's lanes, in order; None when all are placed. Otherwise it
            stopped after an output that must be waited for (a sink's submit, a full
            publisher): ``await settle(wait)``, then call again with the same iterator for
            the rest.

            A per-record agent's loop calls this once per record, with the record at
            hand: what an output needs of its record (origin, key) is found once, not per
            output. Compiled (``fanout.py``): the lane's rule is written into the loop."""

    else:
        place = place_outputs(Wait)

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
