"""Where the CPU of the router on librdkafka goes: by thread, and in the cycle collector.

    python -m benchmarks.probes.router_split [--orders 100000] [--rounds 6] [--bootstrap HOST:PORT]

Starts a Tansu broker (unless ``--bootstrap`` names a running Kafka), pre-loads the clean
orders of ``benchmarks.router_kafka`` once, then runs paired rounds of its hand-written
confluent-kafka loop and of ``examples/router.py`` on ``kafka://...?client=rdkafka``
(each round to topics of its own; ``router_kafka`` is the one that reads the outputs back
and compares them). For each it prints, in µs of CPU an order (medians over the rounds,
ranges beside):

* the process's CPU time, and for flowkit that of each thread: ``main`` (the event loop),
  ``flowkit-rdkafka-consumer`` (``consume`` and the conversion into flowkit ``Message``\\ s),
  ``flowkit-rdkafka-producer`` (delivery reports), ``rdk:*`` (librdkafka's own);
* the CPU spent in the cycle collector (``gc.callbacks``, the collecting thread's CPU
  time), per generation, and how many collections ran;

and the paired ratios hand / flowkit of CPU and wall time. CPU time moves with the load on
a shared machine; the collector's share is the steadier figure. ``--no-freeze`` adds a
third contender to every round: flowkit without freezing its start-up heap
(``flowkit/runtime/lifecycle/heap.py``), as before 2026-12-01.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import threading
import time
import uuid
from typing import Any

import flowkit
from benchmarks import router_kafka as rk
from benchmarks.kafka_broker import kafka_broker
from benchmarks.probes.rdkafka_split import _NAMES, _split, _threads
from examples import router
from flowkit.logs import configure_logging
from flowkit.runtime.lifecycle import heap


class Collector:
    """CPU seconds the cycle collector ran, per generation, while ``counting``."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self.counting = False
        self._started: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.seconds, self.runs = [0.0, 0.0, 0.0], [0, 0, 0]

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.thread_time()
        elif self.counting and me in self._started:
            generation = info["generation"]
            self.runs[generation] += 1
            self.seconds[generation] += time.thread_time() - self._started.pop(me)


COLLECTOR = Collector()
# wall seconds, CPU seconds by thread, collector seconds by generation, collections
Result = tuple[float, dict[str, float], list[float], list[int]]


def hand(source: str, n: int, tag: str, max_records: int) -> Result:
    COLLECTOR.reset()
    COLLECTOR.counting = True
    try:
        wall, cpu = rk.hand_written_rdkafka(source, n, tag, max_records)
    finally:
        COLLECTOR.counting = False
    return wall, {"process": cpu}, COLLECTOR.seconds, COLLECTOR.runs


async def with_flowkit(bootstrap: str, source: str, n: int, tag: str, max_records: int) -> Result:
    routes = [{**r, "to": [f"{t}-{tag}" for t in r["to"]]} for r in router.ROUTES]
    app = router.make_app(routes, demo_traffic=False, name=f"flowkit-{tag}", source=source)
    query = "&".join(f"{k}={v}" for k, v in {**rk.GROUP_SETTINGS, "client": "rdkafka"}.items())
    worker = flowkit.Worker(
        app, broker=f"kafka://{bootstrap}?{query}", max_fetch_records=max_records
    )
    async with worker:
        while worker.records_in == 0:
            rk._check(worker)
            await asyncio.sleep(0.002)
        started, before = time.perf_counter(), _threads()
        COLLECTOR.reset()
        COLLECTOR.counting = True
        while worker.records_in < n or not worker.is_idle():
            rk._check(worker)
            await asyncio.sleep(0.002)
        COLLECTOR.counting = False
        for t in threading.enumerate():
            if t.native_id is not None:
                _NAMES[t.native_id] = t.name.split("_")[0]
        used = _split(before)
        elapsed = time.perf_counter() - started
    return elapsed, dict(used), COLLECTOR.seconds, COLLECTOR.runs


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def summary(rounds: list[dict[str, Result]], n: int) -> None:
    us = 1e6 / n
    print(f"\n{len(rounds)} paired rounds, {n:,} clean orders; µs of CPU an order, median (range)")
    names = list(rounds[0])
    for name in names:
        total = [sum(r[name][1].values()) * us for r in rounds]
        print(f"{name:13s} all threads {_median(total)}")
        if name != "hand-written":
            threads = sorted({t for r in rounds for t in r[name][1]})
            for t in threads:
                values = [r[name][1].get(t, 0.0) * us for r in rounds]
                if max(values) >= 0.05:
                    print(f"{'':13s}   {t:26s} {_median(values)}")
        collected = [sum(r[name][2]) * us for r in rounds]
        by_generation = ", ".join(
            f"gen {g} {statistics.median(r[name][2][g] * us for r in rounds):.2f}"
            f" ({statistics.median(r[name][3][g] for r in rounds):.0f} runs)"
            for g in range(3)
        )
        print(f"{'':13s} cycle collector {_median(collected)}: {by_generation}")
    for name in names[1:]:
        cpu = [sum(r["hand-written"][1].values()) / sum(r[name][1].values()) for r in rounds]
        wall = [r["hand-written"][0] / r[name][0] for r in rounds]
        print(f"{name} / hand-written: CPU {_median(cpu)}, wall {_median(wall)}")


async def unfrozen(bootstrap: str, source: str, n: int, tag: str, max_records: int) -> Result:
    """``with_flowkit`` as before the worker froze its start-up heap."""
    retain, release = heap.retain, heap.release
    heap.retain = heap.release = lambda: None
    try:
        return await with_flowkit(bootstrap, source, n, tag, max_records)
    finally:
        heap.retain, heap.release = retain, release


async def run(bootstrap: str, n: int, rounds: int, max_records: int, compare: bool) -> None:
    rk.BOOTSTRAP[0] = bootstrap
    run_id = uuid.uuid4().hex[:6]
    source = f"router-split-{run_id}"
    await rk.preload(bootstrap, source, rk.orders(n, bad=False))
    results: list[dict[str, Result]] = []
    for i in range(rounds):
        row: dict[str, Result] = {}
        tag = f"{run_id}-h{i}"
        outputs = {f"{t}-{tag}": rk.PARTITIONS for t in rk.ROUTE_TOPICS}
        await rk.create(bootstrap, {**outputs, f"hand-{tag}-dlq": 1})
        gc.collect()
        row["hand-written"] = hand(source, n, tag, max_records)
        gc.collect()
        row["flowkit"] = await with_flowkit(bootstrap, source, n, f"{run_id}-f{i}", max_records)
        if compare:
            gc.collect()
            tag = f"{run_id}-u{i}"
            row["not frozen"] = await unfrozen(bootstrap, source, n, tag, max_records)
        results.append(row)
        print(
            f"round {i}, µs of CPU an order (in the collector): "
            + ", ".join(
                f"{name} {sum(r[1].values()) * 1e6 / n:.1f} ({sum(r[2]) * 1e6 / n:.2f})"
                for name, r in row.items()
            ),
            flush=True,
        )
    summary(results, n)


def main() -> None:
    parser = argparse.ArgumentParser(description="the router on librdkafka: CPU by thread")
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6, help="paired rounds")
    parser.add_argument("--max-records", type=int, default=10_000)
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: Tansu)")
    parser.add_argument("--no-freeze", action="store_true", help="flowkit unfrozen too")
    args = parser.parse_args()
    configure_logging("error")
    with kafka_broker(args.bootstrap) as (bootstrap, _):
        asyncio.run(run(bootstrap, args.orders, args.rounds, args.max_records, args.no_freeze))


if __name__ == "__main__":
    main()
