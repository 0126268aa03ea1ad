"""Session windows for the kill -9 test: each user's hits summed per session, every closed
session a ``WindowResult`` on ``sc-out`` (``window_crash_app``).
"""

from __future__ import annotations

from tests.kafka.apps.window_crash_app import GRACE, PARTITIONS, make_app

__all__ = ["GAP", "GRACE", "PARTITIONS", "app"]

GAP = 2.0

app = make_app("sesscrash", "sc", "visits", lambda table, **common: table.session(GAP, **common))
