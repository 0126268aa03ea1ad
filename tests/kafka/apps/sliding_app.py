"""Sliding windows for the kill -9 test: each user's hits summed over every 4 s window
Kafka Streams' ``SlidingWindows`` defines, every closed window a ``WindowResult`` on
``sl-out`` (``window_crash_app``).
"""

from __future__ import annotations

from tests.kafka.apps.window_crash_app import GRACE, PARTITIONS, make_app

__all__ = ["GRACE", "PARTITIONS", "SIZE", "app"]

SIZE = 4.0

app = make_app("slidecrash", "sl", "recent", lambda table, **common: table.sliding(SIZE, **common))
