"""What operating a worker costs: YSB with the web endpoint scraped versus without it.

    python -m benchmarks.ops_overhead [--events 1000000] [--repeat 7] [--scrape 1.0]

Each paired round runs the YSB app (``examples/ysb.py``) twice over the same events on
the memory broker, in alternating order: once plain, once with the web endpoint on and a
client fetching ``/metrics`` and ``/status`` (what Prometheus and the live page ask)
every ``--scrape`` seconds: as often as the page asks for ``/status``, and 15 times as
often as Prometheus' default scrape interval asks for ``/metrics``. Both runs update
the per-batch metrics (they are always on); the difference is the endpoint, the
scrape-time collectors (lag, tables, watermarks, sinks) and the serving. Since a scrape
costs the same however fast records flow, the work of one request is also timed alone,
and its share of a core at the scrape rate printed: that figure does not depend on how
busy the machine is.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

import aiohttp
from prometheus_client import generate_latest

import flowkit
from benchmarks.rounds import report
from benchmarks.ysb import START_MS, loaded_broker, payloads
from examples import ysb
from flowkit.logs import configure_logging
from flowkit.runtime.web.status import status
from flowkit.testing import FakeClock
from flowkit.transports import MemoryTransport

SCRAPE_COSTS: dict[str, list[float]] = {}  # route -> seconds of handler work per request


async def run(data: list[tuple[bytes, bytes]], web: bool, every: float) -> tuple[float, int]:
    """Seconds to process every event, and how many scrapes were answered meanwhile.
    After a scraped run, the work of one scrape is timed alone (``SCRAPE_COSTS``)."""
    broker = await loaded_broker(data)
    app = ysb.make_app(generate=False, on_close=None)
    worker = flowkit.Worker(
        app,
        transport=MemoryTransport(broker),
        clock=FakeClock(START_MS / 1000 + 3600),
        web_port=0 if web else None,
        status_interval=None,
    )
    scrapes = 0
    async with worker:

        async def scrape() -> None:
            nonlocal scrapes
            assert worker.web is not None
            async with aiohttp.ClientSession() as http:
                while True:
                    for path in ("/metrics", "/status"):
                        async with http.get(worker.web.url + path) as response:
                            await response.read()
                            scrapes += response.status == 200
                    await asyncio.sleep(every)

        scraper = asyncio.create_task(scrape()) if web else None
        start = time.perf_counter()
        while worker.records_in < len(data) or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
        if scraper is not None:
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
            for name, work in (
                ("/metrics", lambda: generate_latest(worker.metrics.registry)),
                ("/status", lambda: status(worker)),
            ):
                begin = time.perf_counter()
                for _ in range(20):
                    work()
                SCRAPE_COSTS.setdefault(name, []).append((time.perf_counter() - begin) / 20)
    return elapsed, scrapes


def main() -> None:
    parser = argparse.ArgumentParser(description="YSB with the web endpoint scraped vs not")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes")
    args = parser.parse_args()
    configure_logging("warning")
    data = payloads(args.events)
    print(f"{args.events:,} YSB events, {ysb.PARTITIONS} partitions, scrape every {args.scrape} s")
    rounds = []
    scrapes = 0
    for i in range(args.repeat):
        times: dict[str, float] = {}
        for web in (False, True) if i % 2 == 0 else (True, False):
            gc.collect()
            seconds, answered = asyncio.run(run(data, web, args.scrape))
            times["web + metrics scraped" if web else "plain"] = seconds
            scrapes += answered
        plain, scraped = times["plain"], times["web + metrics scraped"]
        print(
            f"round {i + 1}: plain {plain:.3f} s, scraped {scraped:.3f} s ({plain / scraped:.2f})"
        )
        rounds.append({"plain": plain, "web + metrics scraped": scraped})
    report(rounds, args.events, "event", [("scraped / plain", "web + metrics scraped", "plain")])
    print(f"{scrapes} scrapes answered during the scraped runs")
    for name, costs in SCRAPE_COSTS.items():
        cost = statistics.median(costs)
        print(
            f"{name}: {cost * 1000:.2f} ms of work per request (median), "
            f"{cost / args.scrape:.2%} of one core at one request every {args.scrape} s"
        )


if __name__ == "__main__":
    main()
