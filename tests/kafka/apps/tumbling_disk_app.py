"""Tumbling windows on local disk (``rocksdb://``) for the kill -9 test: each user's hits
summed per 4 s window, every closed window a ``WindowResult`` on ``tu-out``
(``window_crash_app``); the data directory is the worker's ``--data-dir``.
"""

from __future__ import annotations

from tests.kafka.apps.window_crash_app import GRACE, PARTITIONS, make_app

__all__ = ["GRACE", "PARTITIONS", "SIZE", "app"]

SIZE = 4.0

app = make_app(
    "tumblecrash",
    "tu",
    "sums",
    lambda table, **common: table.tumbling(SIZE, **common),
    store="rocksdb://",
)
