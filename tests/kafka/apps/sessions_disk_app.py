"""Session windows on local disk (``rocksdb://``) for the kill -9 test: each user's hits
summed per session, every closed session a ``WindowResult`` on ``sd-out``
(``window_crash_app``); the data directory is the worker's ``--data-dir``.
"""

from __future__ import annotations

from tests.kafka.apps.sessions_app import GAP
from tests.kafka.apps.window_crash_app import GRACE, PARTITIONS, make_app

__all__ = ["GAP", "GRACE", "PARTITIONS", "app"]

app = make_app(
    "sessdiskcrash",
    "sd",
    "visits",
    lambda table, **common: table.session(GAP, **common),
    store="rocksdb://",
)
