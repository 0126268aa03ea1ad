"""An app for the web tests: clicks counted per user, in a table and in 10 s windows."""

from __future__ import annotations

from collections.abc import AsyncIterator

import flowkit


class Click(flowkit.Record):
    user: str


def build(name: str = "webdemo", partitions: int = 2) -> flowkit.App:
    """A fresh declaration (tests must not share a frozen one with other settings)."""
    app = flowkit.App(name, partitions=partitions)
    clicks = app.topic("clicks", value_type=Click, key_type=str)
    users = app.topic("users", value_type=str)
    counts = app.table("counts", default=int)
    per_window = app.table("per_window", default=int).tumbling(10.0, expires=600.0)

    @app.agent(clicks, sink=[users])
    async def count(stream: flowkit.Stream[Click]) -> AsyncIterator[str]:
        async for click in stream:
            counts[click.user] += 1
            per_window[click.user] += 1
            yield click.user

    return app
