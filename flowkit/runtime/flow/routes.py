"""Where the fetched batches of a topic go: the agents that read it and their sources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...agents import Agent
from ...streams import StreamSource
from ...topics import Topic

__all__ = ["Route"]


@dataclass
class Route:
    """Where the batches of one topic go: per reading agent, its instances' sources."""

    topic: Topic[Any]
    readers: list[tuple[Agent[Any], list[StreamSource]]] = field(default_factory=list)
