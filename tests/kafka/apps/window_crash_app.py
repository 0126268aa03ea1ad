"""What the windowed apps of the kill -9 tests share (``sessions_app``, ``sliding_app``,
``tumbling_disk_app``): users' hits summed per window of one kind, every closed window a
``WindowResult`` on ``<prefix>-out``. The agent sleeps a little per record so that a test
can kill it while windows are open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import flowkit

PARTITIONS = 4
GRACE = 3.0
DELAY = 0.001  # seconds per record: about 1,000 records a second


class Hit(flowkit.Record):
    user: str
    t: int  # event time, ms
    n: int


Windowing = Callable[..., Any]
"""Makes the windowed table of a plain one, given the settings every kind shares: e.g.
``lambda table, **common: table.session(2.0, **common)``."""


def make_app(name: str, prefix: str, table: str, window: Windowing, **settings: Any) -> flowkit.App:
    """The app ``name`` (its group), reading ``<prefix>-hits``; ``table`` is the windowed
    table's name (its changelog is ``<name>-<table>-changelog``); ``settings`` go to the
    App (``store=``)."""
    app = flowkit.App(name, partitions=PARTITIONS, commit_interval=0.3, **settings)
    hits = app.topic(f"{prefix}-hits", value_type=Hit)
    out = app.topic(f"{prefix}-out", value_type=flowkit.WindowResult)
    windows = window(
        app.table(table),
        grace=GRACE,
        aggregate=flowkit.Sum("n"),
        time=lambda hit: hit.t,
        idle_timeout=None,
        to=out,
    )

    @app.agent(hits)
    async def visit(stream: flowkit.Stream[Hit]) -> None:
        async for hit in stream:
            windows.add(hit.user, hit)
            await asyncio.sleep(DELAY)

    return app
