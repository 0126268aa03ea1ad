"""The Yahoo Streaming Benchmark query, on flowkit.

    flowkit worker examples.ysb:app

Ad events (about 250 bytes of JSON each) arrive on ``ysb-events``, keyed by user. The
query: keep ``event_type == "view"``, project ``(ad_id, event_time)``, join ``ad_id`` to its
campaign through a global table (100 campaigns x 10 ads), and count views per campaign
per 10-second tumbling event-time window: a table declared with ``flowkit.Count()``.
Closed windows print and go to the ``ysb-window-counts`` topic.

The agent decodes only the fields the query needs (``AdView``): msgspec skips the rest of
each JSON object, which is the projection. Counting by campaign while events are
partitioned by user uses the windowed table's two-phase aggregation: one repartition hop
per window, campaign and partition instead of one per event.

``make_app(generate=True)`` adds a task that produces events continuously (event time
follows the wall clock, a little out of order); ``generate_events`` makes a fixed data set
for the tests and the benchmark.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import flowkit
from flowkit.windows import Window, WindowResult

CAMPAIGNS = 100
ADS_PER_CAMPAIGN = 10
EVENT_TYPES = ("view", "click", "purchase")
AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
WINDOW_SECONDS = 10.0
PARTITIONS = 4


class AdEvent(flowkit.Record):
    """A full YSB event, as the generator writes it."""

    user_id: str
    page_id: str
    ad_id: str
    ad_type: str
    event_type: str
    event_time: int  # ms
    ip_address: str


class AdView(flowkit.Record):
    """The projection the query reads: msgspec decodes these fields and skips the rest."""

    ad_id: str
    event_type: str
    event_time: int


def _hex(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def campaign_map(seed: int = 42) -> dict[str, str]:
    """ad_id -> campaign_id for 100 campaigns of 10 ads (deterministic)."""
    rng = random.Random(seed)
    mapping: dict[str, str] = {}
    for _ in range(CAMPAIGNS):
        campaign = _hex(rng)
        for _ in range(ADS_PER_CAMPAIGN):
            mapping[_hex(rng)] = campaign
    return mapping


def generate_events(
    count: int, *, start_ms: int, per_second: int = 10_000, seed: int = 7, users: int = 1000
) -> Iterator[tuple[str, AdEvent]]:
    """``count`` (user_id, event) pairs, ``per_second`` events per second of event time."""
    rng = random.Random(seed)
    ads = list(campaign_map())
    user_ids = [_hex(rng) for _ in range(users)]
    pages = [_hex(rng) for _ in range(100)]
    for i in range(count):
        user = rng.choice(user_ids)
        yield (
            user,
            AdEvent(
                user_id=user,
                page_id=rng.choice(pages),
                ad_id=rng.choice(ads),
                ad_type=rng.choice(AD_TYPES),
                event_type=rng.choice(EVENT_TYPES),
                event_time=start_ms + i * 1000 // per_second,
                ip_address="1.2.3.4",
            ),
        )


def show(campaign: str, window: Window, count: int, replayed: bool = False) -> None:
    """Print one closed window (one a restart emits again is marked)."""
    again = "  (replayed)" if replayed else ""
    print(f"window {window}  campaign {campaign[:8]}  views {count}{again}", flush=True)


def make_app(
    *,
    name: str = "ysb",
    generate: bool = True,
    grace: float = 5.0,
    idle_timeout: float | None = 30.0,
    on_close: Callable[..., Any] | None = show,
    per_record: bool = False,
) -> flowkit.App:
    """The YSB app; ``generate`` adds the live event generator task. ``name`` is the
    application id (consumer group and internal topics): a new name starts afresh.
    ``per_record`` writes the agent in the per-record form (the same query and counts)."""
    app = flowkit.App(name, partitions=PARTITIONS)
    events = app.topic("ysb-events", value_type=AdView)
    window_counts = app.topic("ysb-window-counts", value_type=WindowResult, external=True)
    campaigns = app.global_table(
        "ysb-campaigns", value_type=str, loader=lambda: campaign_map().items()
    )
    counts = app.table("campaign-counts", default=int).tumbling(
        WINDOW_SECONDS,
        aggregate=flowkit.Count(),  # views per campaign and window
        grace=grace,
        time=lambda view: view.event_time,
        to=window_counts,
        on_close=on_close,
        idle_timeout=idle_timeout,
    )

    if per_record:

        @app.agent(events, per_record=True)
        def count_views(view: AdView) -> None:
            # Called from inside the stream's loop for each event: no `async for` step.
            if view.event_type == "view":
                counts.add(campaigns[view.ad_id], view, view.event_time)

    else:

        @app.agent(events)
        async def count_views(stream: flowkit.Stream[AdView]) -> None:
            views = stream.filter(lambda v: v.event_type == "view")
            async for view, campaign in views.join(campaigns, on="ad_id"):
                # ts (event time) passed by position: a keyword call costs more per record.
                counts.add(campaign, view, view.event_time)

    if generate:

        @app.task
        async def produce_events() -> None:
            """About 10,000 events a second; event time = now, up to 1 s out of order."""
            loop = asyncio.get_running_loop()
            rng = random.Random(1)
            start = loop.time()
            for sent, (user, event) in enumerate(generate_events(10**12, start_ms=0), 1):
                event.event_time = int(time.time() * 1000) - rng.randint(0, 1000)
                await events.send(event, key=user)  # a wider record: AdView is its projection
                if sent % 1000 == 0:
                    await asyncio.sleep(max(0.0, start + sent / 10_000 - loop.time()))

    return app


app = make_app()
