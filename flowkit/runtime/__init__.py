"""The worker: runs an App's graph over a transport.

``worker.py`` owns the lifecycle; its parts live in rooms: ``flow`` (the record path),
``output`` (outputs and sends), ``letters`` (dead letters), ``tables`` (state),
``lifecycle`` (tasks, timers, rebalances), ``observe`` (metrics, console, logs),
``web`` (the HTTP endpoint) and ``processes`` (``--processes N``).
"""

from __future__ import annotations

from .lifecycle.required import required_topics
from .worker import Worker

__all__ = ["Worker", "required_topics"]
