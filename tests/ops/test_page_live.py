"""The live page in a real headless Chromium, in real time: its drawing (no edge behind a
box, long names fitted), its sparklines and rates against ``/metrics``, and its panel of
dead letters (hostile content shown as text).

Needs Debian's ``chromium`` and ``chromium-driver`` (CI installs them); without them the
tests are skipped, saying so.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

import flowkit
from flowkit.clock import SystemClock
from flowkit.testing import TestDriver
from tests.ops.test_page import CHROMEDRIVER, CHROMIUM, browser, wait_for

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)",
)

LONG = "customer-orders-from-the-eu-region-enriched-with-their-shops"  # 60 characters
assert len(LONG) == 60


class Order(flowkit.Record):
    id: str
    customer: str
    amount: int


class Payment(flowkit.Record):
    order_id: str
    amount: int


def pipeline(name: str) -> flowkit.App:
    """Several agents, topics, a table, a join and a 60-character topic name."""
    app = flowkit.App(name, partitions=2)
    orders = app.topic(LONG, value_type=Order)
    payments = app.topic("payments", value_type=Payment)
    paid = app.topic("paid", value_type=str)
    audit = app.topic("audit", value_type=str)
    totals = app.table("totals", default=int)
    settled = app.join(orders, payments, within=60.0, grace=10.0, how="left", name="settled")

    @app.agent(orders, sink=[audit])
    async def tally(stream: flowkit.Stream[Order]) -> AsyncIterator[str]:
        async for order in stream:
            totals[order.customer] += order.amount
            yield order.id

    @app.agent(settled, sink=[paid])
    async def settle(stream: flowkit.Stream[flowkit.Joined]) -> AsyncIterator[str]:
        async for joined in stream:
            yield joined.left.id

    @app.agent(audit)
    async def check(stream: flowkit.Stream[str]) -> AsyncIterator[None]:
        async for _ in stream:
            yield None

    @app.agent(paid)
    async def ship(stream: flowkit.Stream[str]) -> AsyncIterator[None]:
        async for _ in stream:
            yield None

    return app


# Every edge's drawn path, sampled along its length in screen coordinates, against every
# box's drawn rectangle: the points strictly inside a box the edge does not connect, and
# whether the edge starts on its source's box and ends on its target's.
GEOMETRY = """
const boxes = {};
for (const g of document.querySelectorAll('#graph .node')) {
  const r = g.querySelector('rect').getBoundingClientRect();
  boxes[g.dataset.id] = r;
}
const inside = (r, p, m) => p.x > r.left + m && p.x < r.right - m && p.y > r.top + m
  && p.y < r.bottom - m;
const near = (r, p) => p.x >= r.left - 1.5 && p.x <= r.right + 1.5 && p.y >= r.top - 1.5
  && p.y <= r.bottom + 1.5 && !inside(r, p, 1.5);
const out = {edges: 0, crossings: [], unattached: []};
for (const path of document.querySelectorAll('#graph path.edge')) {
  out.edges += 1;
  const m = path.getScreenCTM(), length = path.getTotalLength();
  const at = s => {
    const q = path.getPointAtLength(s);
    return new DOMPoint(q.x, q.y).matrixTransform(m);
  };
  const {source, target} = path.dataset;
  for (let s = 0; s <= length; s += 1) {
    const p = at(s);
    for (const [id, r] of Object.entries(boxes)) {
      if (id !== source && id !== target && inside(r, p, 0.5)) {
        out.crossings.push(`${source} -> ${target} passes behind ${id}`);
      }
    }
  }
  if (!near(boxes[source], at(0)) || !near(boxes[target], at(length))) {
    out.unattached.push(`${source} -> ${target}`);
  }
}
out.crossings = [...new Set(out.crossings)];
return out;
"""

# The 60-character topic's box: its tooltip, the name shown, and whether the name's drawn
# extent stays inside the box.
NAME = """
const g = document.querySelector(`#graph .node[data-id="topic:${arguments[0]}"]`);
const rect = g.querySelector('rect').getBoundingClientRect();
const text = g.querySelector('text.name');
const box = text.getBoundingClientRect();
return {title: g.querySelector('title').textContent, shown: text.textContent,
        inside: box.left >= rect.left && box.right <= rect.right};
"""


async def test_no_edge_passes_behind_a_box_and_long_names_fit() -> None:
    app = pipeline("pagegeometry")
    async with TestDriver(app, web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        chrome: Any = await asyncio.to_thread(browser)
        try:

            def check() -> tuple[dict[str, Any], dict[str, Any]]:
                chrome.get(web.url)
                wait_for(chrome, "return document.querySelector('svg[data-rendered]')")
                return chrome.execute_script(GEOMETRY), chrome.execute_script(NAME, LONG)

            geometry, name = await asyncio.to_thread(check)
        finally:
            await asyncio.to_thread(chrome.quit)
    assert geometry["edges"] >= 10
    assert geometry["crossings"] == []
    assert geometry["unattached"] == []
    assert name["title"] == LONG
    assert name["shown"].endswith("\u2026") and LONG.startswith(name["shown"][:-1])
    assert name["inside"]


class Event(flowkit.Record):
    n: int
    note: str


HOSTILE = "<script>document.title='owned'</script>\x1b[31mred\x1b[0m<img src=x>"


def hostile(name: str) -> flowkit.App:
    app = flowkit.App(name, partitions=2)
    events = app.topic("events", value_type=Event)

    @app.agent(events)
    async def work(stream: flowkit.Stream[Event]) -> AsyncIterator[None]:
        async for event in stream:
            if event.note:
                raise ValueError(event.note)
            yield None

    return app


def processed(url: str, agent: str) -> tuple[float, float]:
    """(monotonic time, the agent's records processed) read from ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    line = f'flowkit_records_processed_total{{agent="{agent}"}} '
    for row in text.splitlines():
        if row.startswith(line):
            return time.monotonic(), float(row[len(line) :])
    return time.monotonic(), 0.0


# What the page shows of the agent "work": records/s (its data-rate), the points of its
# three sparklines, and its p99.
FIGURES = """
const row = document.querySelector('#agents-body tr[data-agent="work"]');
if (!row) return null;
return {rate: row.querySelector('td.rate').dataset.rate,
        points: [...row.querySelectorAll('svg.spark')].map(s => +s.dataset.points),
        polylines: row.querySelectorAll('svg.spark polyline').length,
        p99: row.querySelector('td.p99').textContent};
"""

# The sparklines are drawn, the records/s one with 5 points at least.
SPARKS = """
const lines = document.querySelectorAll('#agents svg.spark polyline');
const first = document.querySelector('#agents svg.spark');
return lines.length === 3 && +first.dataset.points >= 5;
"""

LETTER = """
const item = document.querySelector('#letters li.letter');
if (!item) return null;
return {error: item.querySelector('.error').textContent,
        message: item.querySelector('.message').textContent,
        where: item.querySelector('.where').textContent,
        text: item.textContent,
        elements: item.querySelectorAll('script, img').length,
        title: document.title};
"""


async def test_rates_sparklines_and_dead_letters_in_real_time() -> None:
    app = hostile("pagelive")
    events = app.topics["events"]
    async with TestDriver(app, web_port=0, clock=SystemClock()) as driver:
        web = driver.worker.web
        assert web is not None
        stop = asyncio.Event()

        async def traffic() -> None:  # about 100 records a second, in wall-clock time
            n = 0
            while not stop.is_set():
                note = HOSTILE if n == 50 else ""
                await driver.send(events, Event(n, note), key=str(n % 7))
                n += 1
                await asyncio.sleep(0.01)

        sender = asyncio.create_task(traffic())
        chrome: Any = await asyncio.to_thread(browser)
        try:

            def check() -> tuple[Any, Any, float]:
                chrome.get(web.url)
                wait_for(chrome, "return document.querySelector('svg[data-rendered]')")
                letter = wait_for(chrome, LETTER)
                # the page's rate is over its last 5 s of polls: /metrics over the same span
                wait_for(chrome, SPARKS)
                t0, c0 = processed(web.url, "work")
                time.sleep(5.0)
                t1, c1 = processed(web.url, "work")
                figures = chrome.execute_script(FIGURES)
                return letter, figures, (c1 - c0) / (t1 - t0)

            letter, figures, expected = await asyncio.to_thread(check)
        finally:
            await asyncio.to_thread(chrome.quit)
            stop.set()
            await sender
    assert expected > 20, expected
    shown = float(figures["rate"])
    assert abs(shown - expected) <= 0.25 * expected, (shown, expected)
    assert all(p >= 5 for p in figures["points"]) and figures["polylines"] == 3
    assert figures["p99"] != "-"
    assert letter["error"] == "ValueError"
    # shown as text: the tags as they are, the escapes written out
    assert letter["message"] == HOSTILE.replace("\x1b", "\\x1b")
    assert letter["elements"] == 0 and letter["title"] != "owned"
    assert "events[" in letter["where"] and "pagelive-dlq" in letter["where"]
    assert "test_page_live.py" in letter["where"]  # where in the code it failed
    assert "work" in letter["text"]
