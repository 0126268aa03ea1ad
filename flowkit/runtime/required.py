"""The topics a worker of an app needs, declared and internal, with their partition counts."""

from __future__ import annotations

from ..app import App
from ..deadletter import dead_letter_topic
from ..transports import TopicSpec
from .state import StateKeeper

__all__ = ["required_topics"]


def required_topics(app: App) -> list[TopicSpec]:
    """Every topic a worker of ``app`` needs: declared, dead-letter, changelog and
    repartition topics, with their partition counts."""
    specs = [TopicSpec(t.name, t.partitions, compacted=t.compacted) for t in app.topics.values()]
    dead_letters = {dead_letter_topic(app.name)}
    dead_letters.update(a.dead_letter for a in app.agents if a.dead_letter)
    specs.extend(TopicSpec(name, 1) for name in sorted(dead_letters) if name not in app.topics)
    specs.extend(StateKeeper.specs_for(app))
    return specs
