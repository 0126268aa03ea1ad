"""Where the CPU of YSB on librdkafka goes, thread by thread (Linux: reads /proc).

    python -m benchmarks.probes.rdkafka_split [--events 400000] [--repeat 6] [--max-records 2000]

Starts a Tansu broker (unless ``--bootstrap`` names a running Kafka), pre-loads the YSB
events once, then runs paired rounds of three contenders on the same topic:

* ``hand``: the hand-written confluent-kafka loop of ``benchmarks.ysb_clients``;
* ``hand+filing``: the same loop, each batch first filed by partition by the rdkafka
  transport's own ``_runs`` (what flowkit does before its loop starts), the values read
  through the ``RawMessages`` it returns, as flowkit's stream loop reads them;
* ``flowkit``: the YSB app on ``kafka://...?client=rdkafka``.

For each it prints the CPU seconds a record of every thread of the process over the timed
interval (``main`` is the event loop's or the hand loop's thread, ``consume`` flowkit's
consume thread, ``rdk:*`` librdkafka's own), the CPU the conversion itself took, and the
paired ratios hand / contender in CPU and wall time. Medians over rounds, ranges beside.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

import flowkit
from benchmarks import ysb_clients as yc
from benchmarks import ysb_kafka as yk
from benchmarks.kafka_broker import kafka_broker
from examples import ysb
from flowkit.logs import configure_logging
from flowkit.transports.rdkafka import consumer as rdconsumer

_TICK = os.sysconf("SC_CLK_TCK")
_NAMES: dict[int, str] = {}  # thread id -> our name for it


def _threads() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every thread of this process, by thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def _split(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    used: dict[str, float] = defaultdict(float)
    for tid, (name, cpu) in _threads().items():
        label = "main" if tid == os.getpid() else _NAMES.get(tid, name)
        used[label] += cpu - before.get(tid, (name, 0.0))[1]
    return used


class _Conversion:
    """CPU seconds spent in the transport's conversion, in whichever thread runs it."""

    def __init__(self) -> None:
        self.seconds, self.records = 0.0, 0
        self._lock = threading.Lock()

    @contextmanager
    def counting(self) -> Iterator[None]:
        original: Callable[..., Any] = rdconsumer._runs

        def timed(records: list[Any]) -> Any:
            _NAMES.setdefault(threading.get_native_id(), "consume")
            started = time.thread_time()
            try:
                return original(records)
            finally:
                with self._lock:
                    self.seconds += time.thread_time() - started
                    self.records += len(records)

        rdconsumer._runs = timed
        try:
            yield
        finally:
            rdconsumer._runs = original


Result = tuple[float, dict[str, float], float]  # wall seconds, CPU by thread, conversion CPU


def hand(bootstrap: str, n: int, max_records: int, filing: bool) -> Result:
    decode = msgspec.json.Decoder(ysb.AdView).decode
    ads = ysb.campaign_map()
    counts: yk.Counts = Counter()
    conversion = _Conversion()
    consumer = yk._rd_consumer(bootstrap)
    try:
        with conversion.counting():
            seen, started, before = 0, 0.0, _threads()
            while seen < n:
                records = consumer.consume(max_records, 0) or consumer.consume(1, 1.0)
                if not seen and records:
                    started, before = time.perf_counter(), _threads()
                seen += len(records)
                if not filing:  # exactly the loop of benchmarks.ysb_clients
                    for record in records:
                        view = decode(record.value())
                        if view.event_type == "view":
                            t = view.event_time
                            counts[ads[view.ad_id], t - t % yk.WINDOW_MS] += 1
                    continue
                for batch in rdconsumer._runs(records).values():
                    value_of = batch.value_of
                    for record in batch.raw:
                        view = decode(value_of(record))  # type: ignore[arg-type]
                        if view.event_type == "view":
                            t = view.event_time
                            counts[ads[view.ad_id], t - t % yk.WINDOW_MS] += 1
            used = _split(before)
        return time.perf_counter() - started, used, conversion.seconds
    finally:
        consumer.close()


async def with_flowkit(bootstrap: str, n: int, max_records: int) -> Result:
    await yk.reset_internal_topics(bootstrap)
    worker = flowkit.Worker(
        yk.make_app(name=f"ysb-split-{uuid.uuid4().hex[:8]}"),
        broker=yc.broker_url(bootstrap, "rdkafka"),
        max_fetch_records=max_records,
    )
    conversion = _Conversion()
    with conversion.counting():
        async with worker:
            await yk._until(worker, lambda: worker.records_in > 0, 60)
            started, before = time.perf_counter(), _threads()
            await yk._until(worker, lambda: yk._done(worker, n), 600)
            used = _split(before)
            elapsed = time.perf_counter() - started
    return elapsed, used, conversion.seconds


CONTENDERS = ("hand", "hand+filing", "flowkit")


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def summary(rounds: list[dict[str, Result]], n: int) -> None:
    us = 1e6 / n
    print(f"{len(rounds)} paired rounds, {n:,} events; µs of CPU a record, median (range)")
    for name in CONTENDERS:
        cpu = [sum(r[name][1].values()) * us for r in rounds]
        line = f"{name:14s} all threads {_median(cpu)}"
        conversion = [r[name][2] * us for r in rounds]
        if max(conversion) > 0:
            line += f", of which the conversion {_median(conversion)}"
        print(line)
        threads = sorted({t for r in rounds for t in r[name][1]})
        per = {t: [r[name][1].get(t, 0.0) * us for r in rounds] for t in threads}
        shown = [f"{t} {statistics.median(v):.2f}" for t, v in per.items() if max(v) >= 0.05]
        print(f"{'':14s} by thread: {', '.join(shown)}")
    for name in CONTENDERS[1:]:
        cpu = [sum(r["hand"][1].values()) / sum(r[name][1].values()) for r in rounds]
        wall = [r["hand"][0] / r[name][0] for r in rounds]
        print(f"hand / {name:13s}: CPU {_median(cpu)}, wall {_median(wall)}")


async def run(bootstrap: str, events: int, repeat: int, max_records: int) -> None:
    await yk.preload(bootstrap, yk.payloads(events))
    print(f"max_records={max_records}")
    rounds: list[dict[str, Result]] = []
    for _ in range(repeat):
        results: dict[str, Result] = {}
        for name in CONTENDERS:
            gc.collect()
            if name == "flowkit":
                results[name] = await with_flowkit(bootstrap, events, max_records)
            else:
                results[name] = hand(bootstrap, events, max_records, name == "hand+filing")
        rounds.append(results)
    summary(rounds, events)


def main() -> None:
    parser = argparse.ArgumentParser(description="YSB on librdkafka: CPU by thread")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=6, help="paired rounds")
    parser.add_argument("--max-records", type=int, default=2000, help="records per fetch")
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: Tansu)")
    args = parser.parse_args()
    configure_logging("warning")
    with kafka_broker(args.bootstrap) as (bootstrap, _):
        asyncio.run(run(bootstrap, args.events, args.repeat, args.max_records))


if __name__ == "__main__":
    main()
