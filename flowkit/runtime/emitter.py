"""An agent instance's outputs on their way to its sinks: one ``Emitter`` per instance.

Made once, when the worker is built: it holds the agent's targets, the ``Output(to=...)``
choices already resolved, and its count of outputs, so an output costs no lookup by agent
name. The record that caused an output (its origin, for the key and for a refusal) is
asked of the stream source once per record, not once per output. Topic outputs are only
buffered by the publisher, with no coroutine per output; ``emit`` returns what must still
be awaited (a sink's submit, a full publisher), or None.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..agents import KEEP_KEY, Agent, Output
from ..records import Headers
from ..sinks import SinkRunner
from ..streams import StreamSource
from ..topics import accepts
from .targets import Target, Targets

__all__ = ["Emitter"]

# Publisher.publish(topic, value, key, headers, origin, timestamp_ms=None) -> "relieve me"
Publish = Callable[..., bool]


class Emitter:
    """Sends the outputs of one agent instance to its sinks."""

    __slots__ = (
        "_cause",
        "_origin",
        "_publish",
        "_relieve",
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
        publish: Publish,
        relieve: Callable[[], Awaitable[None]],
    ) -> None:
        self.agent = agent
        self.source = source
        self.targets = targets  # the agent's sinks
        self._resolver = resolver
        self._routed = resolver.seen(agent)  # Output.to -> its targets (shared by instances)
        self._publish = publish
        self._relieve = relieve
        self.count = 0  # outputs so far: moved to the metrics once per checkpoint
        self._cause: Any = None  # the message of the last output, and its origin
        self._origin: Any = None

    def emit(self, out: Any) -> Awaitable[None] | None:
        """Send one output (a value, or an ``Output``) to the agent's sinks, or to the ones
        ``Output.to`` names."""
        targets = self.targets
        self.count += 1
        key: Any = KEEP_KEY
        headers: Headers = ()
        value = out
        if isinstance(out, Output):
            value, key, headers, to = out
            if type(headers) is not tuple:
                headers = tuple(headers)
            if to is not None:
                try:
                    targets = self._routed[to]
                except (KeyError, TypeError):  # not seen yet, or not hashable (a list)
                    targets = self._resolver.routed(self.agent, to)
        message = self.source.current_message()
        if message is self._cause:  # another output of the same record
            origin = self._origin
        else:
            self._cause = message
            origin = self._origin = None if message is None else (message, self.agent.name)
        relieve = False
        runners: list[SinkRunner] | None = None
        encode: Any = None
        data: bytes | None = None
        publish = self._publish
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
                        f"agent {self.agent.name!r} yielded {type(value).__qualname__}, but "
                        f"topic {topic.name!r} takes {topic.value_type_name}"
                    )
                if key is KEEP_KEY:
                    raw_key = message.key if message is not None else None
                else:
                    raw_key = topic.encode_key(key)
                if target.encode is not encode:  # a fan-out encodes a value once
                    encode = target.encode
                    data = None if value is None else encode(value)
                if publish(topic.name, data, raw_key, headers, origin):
                    relieve = True
            elif target.runner is not None:
                if runners is None:
                    runners = []
                runners.append(target.runner)
        if runners is None and not relieve:
            return None
        return self._slow(runners, value, origin, relieve)

    async def _slow(
        self, runners: list[SinkRunner] | None, value: Any, origin: Any, relieve: bool
    ) -> None:
        if relieve:
            await self._relieve()
        for runner in runners or ():
            await runner.submit(value, origin)
