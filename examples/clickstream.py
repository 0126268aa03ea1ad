"""Clickstream: synthetic page views, filtered and counted per page.

Run it with no setup (embedded broker):

    flowkit worker examples.clickstream:app

A task produces random clicks; the ``count_views`` agent keeps views (not bots), counts
them per page and every 100 views yields a ``PageCount`` to the ``page-counts`` topic; the
``report`` agent prints each count as it arrives.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator

import flowkit

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login"]


class Click(flowkit.Record):
    user_id: str
    page: str
    event_type: str  # "view" or "click"
    is_bot: bool
    event_time: int  # ms


class PageCount(flowkit.Record):
    page: str
    views: int


app = flowkit.App("clickstream")
clicks = app.topic("clicks", value_type=Click, partitions=4)
page_counts = app.topic("page-counts", value_type=PageCount, partitions=4)


@app.task
async def generate_traffic() -> None:
    """Produce about 2,000 clicks a second until the worker stops."""
    rng = random.Random(7)
    clock = 1_700_000_000_000
    while True:
        for _ in range(200):
            clock += rng.randint(0, 5)
            await clicks.send(
                Click(
                    user_id=f"u{rng.randint(1, 500)}",
                    page=rng.choice(PAGES),
                    event_type=rng.choice(("view", "view", "click")),
                    is_bot=rng.random() < 0.1,
                    event_time=clock,
                ),
                key=f"u{rng.randint(1, 500)}",
            )
        await asyncio.sleep(0.1)


@app.agent(clicks, sink=[page_counts])
async def count_views(stream: flowkit.Stream[Click]) -> AsyncIterator[PageCount]:
    """Count human page views per page; report every 100th view of a page."""
    views: Counter[str] = Counter()
    async for click in stream.filter(lambda c: c.event_type == "view" and not c.is_bot):
        views[click.page] += 1
        if views[click.page] % 100 == 0:
            yield PageCount(page=click.page, views=views[click.page])


@app.agent(page_counts)
async def report(stream: flowkit.Stream[PageCount]) -> None:
    """Print each page count as it arrives."""
    async for count in stream:
        print(f"{count.page:<10} {count.views:>7} views", flush=True)
