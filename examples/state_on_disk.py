"""State on local disk: a table, a tumbling table, a sliding table and a join's buffers
in RocksDB.

    pip install -e ".[dev,rocksdb]"
    flowkit dev-broker &      # a Kafka broker for development, on 127.0.0.1:9092
    flowkit worker examples.state_on_disk:app --data-dir state --broker kafka://127.0.0.1:9092

A task generates page views and purchases. One agent counts each user's views (a plain
table), the views of each page per 10-second window (a tumbling table) and each user's
views over the last 60 seconds at every view (a sliding table); a join pairs each
purchase with the views of its user in the 30 seconds around it. With
``store="rocksdb://"`` all four keep their state in ``state/`` (one RocksDB database a
partition), stamped at each checkpoint with the changelog offset it reflects.

Stop the worker (Ctrl-C) and start it again: its ``tables recovered`` line says
``from_local_state=16`` (4 partitions of 4 stores) and replays only what the changelogs got
after the last checkpoint, instead of every change since the first run. On the embedded
broker (no ``--broker``) it runs as well, but the changelogs go with the process: a restart
there finds its local state ahead of them, says so for each partition and starts afresh.
"""

from __future__ import annotations

import asyncio
import random
import time

import flowkit

PARTITIONS = 4
USERS = [f"u{i}" for i in range(50)]
PAGES = ["/home", "/docs", "/pricing", "/blog"]


class View(flowkit.Record):
    """A user viewed a page."""

    user: str
    page: str


class Purchase(flowkit.Record):
    """A user bought something."""

    user: str
    amount: int  # cents


def make_app(*, data_dir: str | None = None, generate: bool = True) -> flowkit.App:
    """The app, its state on disk under ``data_dir`` (``--data-dir`` overrides it);
    ``generate`` adds the live traffic."""
    app = flowkit.App("state_on_disk", partitions=PARTITIONS, store="rocksdb://", data_dir=data_dir)
    views = app.topic("views", value_type=View)
    purchases = app.topic("purchases", value_type=Purchase)
    per_user = app.table("views_per_user", default=int)
    per_page = app.table("views_per_page", default=int).tumbling(10.0)
    last_minute = app.table("views_last_minute", default=int).sliding(60.0)
    bought_after = app.join(purchases, views, within=30.0, name="bought_after")

    @app.agent(views)
    async def count(stream: flowkit.Stream[View]) -> None:
        async for view in stream:
            per_user[view.user] += 1
            per_page[view.page] += 1
            last_minute.add(view.user, 1)

    @app.agent(bought_after)
    async def report(stream: flowkit.Stream[flowkit.Joined]) -> None:
        async for joined in stream:
            purchase, view = joined.left, joined.right
            print(f"{purchase.user} bought after viewing {view.page}")

    if generate:

        @app.task
        async def traffic() -> None:
            """About 50 views and 2 purchases a second, keyed by user."""
            rng = random.Random(7)
            while True:
                now = int(time.time() * 1000)
                for _ in range(50):
                    user = rng.choice(USERS)
                    view = View(user, rng.choice(PAGES))
                    await views.send(view, key=user, timestamp_ms=now)
                for _ in range(2):
                    user = rng.choice(USERS)
                    await purchases.send(Purchase(user, rng.randrange(100, 9_999)), key=user)
                await asyncio.sleep(1.0)

    return app


app = make_app()
