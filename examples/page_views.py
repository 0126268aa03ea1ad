"""Faust's page-views tutorial, ported: views per page in 10-second tumbling windows.

The Faust original (its "Count page views" playbook, with the windowed table of its
tables guide)::

    class PageView(faust.Record):
        id: str
        user: str

    app = faust.App("page_views", broker="kafka://localhost:9092", topic_partitions=4)
    page_view_topic = app.topic("page_views", value_type=PageView)
    page_views = app.Table("page_views", default=int).tumbling(
        10.0, expires=timedelta(minutes=10)
    )

    @app.agent(page_view_topic)
    async def count_page_views(views):
        async for view in views.group_by(PageView.id):
            page_views[view.id] += 1
            print(view.id, page_views[view.id].current(), page_views[view.id].delta(10))

In flowkit the ``group_by`` goes: a windowed table counts on each source partition and
combines the partitions' counts on the partition that owns the page (two-phase
aggregation), so the views stay keyed by user. Run it with ``python -m
examples.page_views`` (a test driver feeds it views on a fake clock). As a worker it waits
for views, which on Kafka you can write by hand::

    flowkit worker examples.page_views:app --broker kafka://127.0.0.1:9092
    flowkit send examples.page_views:app page_views '{"id": "/home", "user": "ann"}' \\
        --key ann --broker kafka://127.0.0.1:9092
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import flowkit
from flowkit.logs import configure_logging
from flowkit.testing import FakeClock, TestDriver


class PageView(flowkit.Record):
    id: str
    user: str


app = flowkit.App("page_views", partitions=4)
page_view_topic = app.topic("page_views", value_type=PageView, external=True)
page_views = app.table("page_views", default=int).tumbling(10.0, expires=timedelta(minutes=10))


@app.agent(page_view_topic)
async def count_page_views(views: flowkit.Stream[PageView]) -> None:
    async for view in views:
        page_views[view.id] += 1
        window = page_views[view.id]
        print(f"{view.id}: {window.current()} now, {window.delta(10)} in the window before")


# (seconds after the start, page, user): two windows of views, by four users.
VIEWS = [
    (0, "/home", "ann"),
    (2, "/home", "bob"),
    (3, "/docs", "cat"),
    (4, "/home", "dan"),
    (11, "/home", "ann"),
    (13, "/docs", "bob"),
]


async def main() -> None:
    """Feed ``VIEWS`` through the app on a fake clock; the agent prints each count."""
    clock = FakeClock(start=1_700_000_000.0)  # a multiple of 10 s: a window starts here
    start = int(clock.time())
    async with TestDriver(app, clock=clock) as driver:
        for at, page, user in VIEWS:
            timestamp_ms = (start + at) * 1000  # the record timestamp: its event time
            await driver.send(
                page_view_topic, PageView(page, user), key=user, timestamp_ms=timestamp_ms
            )
            await driver.run_until_idle()  # one at a time, so the prints come in order
        print("/home by window:", list(page_views["/home"].windows().values()))


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())
