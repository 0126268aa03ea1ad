"""Where an agent's outputs go: each sink it names, resolved once to a ``Target``.

A topic target carries the encode function of the topic's codec (shared by codecs of one
class, whose msgspec encoders take no type, so a fan-out encodes a value once); any other
sink gets one ``SinkRunner`` per sink object. ``Output(to=...)`` choices are resolved once
per distinct ``to``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...agents import Agent
from ...app import App
from ...errors import DefinitionError
from ...sinks import CallableSink, Sink, SinkRunner, runner_options, sink_name
from ...topics import Topic

__all__ = ["Target", "Targets"]


@dataclass(frozen=True)
class Target:
    """Where an output goes: a topic (with its encode function) or a sink's runner."""

    topic: Topic[Any] | None = None
    runner: SinkRunner | None = None
    encode: Callable[[Any], bytes] | None = None  # the codec's own encoder: no extra frame
    checked: Any = None  # the topic's value type, when outputs are checked against it

    @classmethod
    def for_topic(cls, topic: Topic[Any], shared: dict[type, Any]) -> Target:
        codec = topic.value_codec
        vt = topic.value_type
        checked = vt if isinstance(vt, type) and vt is not object else None
        raw = getattr(codec, "_encoder", None)
        if raw is None:
            return cls(topic=topic, encode=topic.encode, checked=checked)
        # msgspec's encoders take no type: one per codec class gives the same bytes, and
        # the same (identical) encode function lets a fan-out encode a value once.
        encode = shared.get(type(codec))
        if encode is None:
            encode = shared[type(codec)] = raw.encode
        return cls(topic=topic, encode=encode, checked=checked)


class Targets:
    """Resolves and remembers the targets of one worker's agents."""

    def __init__(self, app: App, *, on_give_up: Callable[..., Any], spawn: Any) -> None:
        self.app = app
        self._on_give_up = on_give_up
        self._spawn = spawn
        self.started = False  # sink writers run: a runner made later starts at once
        self.runners: dict[int, SinkRunner] = {}
        self._encoders: dict[type, Any] = {}  # codec class -> its shared encode function
        self._route_cache: dict[tuple[str, tuple[Any, ...]], list[Target]] = {}
        self._route_seen: dict[str, dict[Any, list[Target]]] = {}

    def resolve(self, agent: Agent[Any], sink: Any) -> Target:
        """The target ``sink`` names for ``agent``: a topic, an agent's topic, a topic name,
        a ``Sink`` or a callable (one runner per sink object, shared by agents)."""
        if isinstance(sink, Topic):
            return Target.for_topic(sink, self._encoders)
        if isinstance(sink, Agent):
            return self.resolve(agent, sink.topic)
        if isinstance(sink, str):
            topic = self.app.topics.get(sink)
            if topic is None:
                raise DefinitionError(f"agent {agent.name!r} writes undeclared topic {sink!r}")
            return Target.for_topic(topic, self._encoders)
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
            runner = SinkRunner(
                wrapped,
                name=sink_name(sink),
                on_give_up=self._on_give_up,
                **runner_options(sink),  # checked: one named at run time by Output(to=)
            )
            if self.started:  # a target first named by an Output(to=...) at run time
                runner.start(self._spawn)
            self.runners[id(sink)] = runner
        return Target(runner=runner)

    def seen(self, agent: Agent[Any]) -> dict[Any, list[Target]]:
        """The ``Output(to=...)`` choices of ``agent`` resolved so far (a tuple or a name ->
        its targets); ``routed`` adds to it."""
        seen = self._route_seen.get(agent.name)
        if seen is None:
            seen = self._route_seen[agent.name] = {}
        return seen

    def routed(self, agent: Agent[Any], to: Any) -> list[Target]:
        """The targets an ``Output(to=...)`` names, resolved once per distinct ``to``."""
        seen = self.seen(agent)
        try:
            return seen[to]  # the same tuple or name again: no key to build
        except (KeyError, TypeError):
            pass
        chosen = tuple(to) if isinstance(to, list | tuple) else (to,)
        key = (agent.name, chosen)
        try:
            return self._route_cache[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable target: resolve it every time
            return [self.resolve(agent, t) for t in chosen]
        targets = self._route_cache[key] = [self.resolve(agent, t) for t in chosen]
        if isinstance(to, tuple | str | Topic):  # a Topic is a declaration: bounded
            seen[to] = targets
        return targets
