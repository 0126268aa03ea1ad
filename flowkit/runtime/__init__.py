"""The worker: runs an App's graph over a transport.

``worker.py`` owns the lifecycle, the fetch loop, rebalancing and checkpoints;
``dispatch.py`` runs the agents, routes their outputs and applies error policies;
``state.py`` recovers and flushes tables.
"""

from __future__ import annotations

from .required import required_topics
from .worker import Worker

__all__ = ["Worker", "required_topics"]
