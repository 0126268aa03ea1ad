"""What a worker requires of its app before it starts: a valid graph, and the topics it
needs, declared and internal, with their partition counts."""

from __future__ import annotations

import asyncio

from ...app import App
from ...deadletter import dead_letter_topic
from ...errors import GraphError
from ...graph import Graph
from ...transports import TopicSpec
from ..tables.keeper import StateKeeper

__all__ = ["checked_graph", "required_topics"]


async def checked_graph(app: App) -> Graph:
    """The graph of ``app``, built once and checked: ``GraphError`` lists its problems,
    those its topics' codecs find outside the app (a schema registry's) among them."""
    graph = app.graph()
    problems = graph.check()
    if problems:
        raise GraphError(problems)
    if graph.codec_checks():  # a registry's lookups block: in a thread
        problems = await asyncio.to_thread(graph.check_codecs)
        if problems:
            raise GraphError(problems)
    return graph


def required_topics(app: App) -> list[TopicSpec]:
    """Every topic a worker of ``app`` needs: declared, dead-letter, changelog and
    repartition topics, with their partition counts."""
    specs = [
        TopicSpec(t.name, t.partitions, compacted=t.compacted, internal=t.internal)
        for t in app.topics.values()
    ]
    dead_letters = {dead_letter_topic(app.name)}
    dead_letters.update(a.dead_letter for a in app.agents if a.dead_letter)
    specs.extend(
        TopicSpec(name, 1, internal=True) for name in sorted(dead_letters) if name not in app.topics
    )
    specs.extend(StateKeeper.specs_for(app))
    return specs
