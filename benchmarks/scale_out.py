"""Scale-out: ``flowkit worker --processes 2`` against one worker process, same data, same run.

    python -m benchmarks.scale_out [--events 1000000] [--repeat 3] [--bootstrap HOST:PORT]
                                   [--client aiokafka|rdkafka]

Starts a Tansu broker (unless ``--bootstrap`` names a running Kafka), pre-loads ``--events``
YSB events into the 4-partition topic ``ysb-events`` (as ``benchmarks.ysb_kafka`` does),
then, in paired rounds, runs the YSB app (``examples/ysb.py``: filter, global-table join,
two-phase windowed count) through the real command line twice:

* one process: ``flowkit worker benchmarks.scale_out:bench_app``;
* two processes: the same with ``--processes 2`` (one parent, two workers in one group).

Each run reads the whole topic from the start with a consumer group and internal topics
of its own. The clock is read from the web endpoint's ``/metrics`` (every 100 ms, the same
for both): it starts when the first event has been fetched (so process start-up and the
group join are not timed) and stops when the agent has moved past every event and no
partition has lag. A run in which the group rebalanced after it started (a process joined
late) is run again. Every run's window counts are checked against a count made here.

Beside the rates it prints where the CPU went during the timed part (the broker and each
worker process, from /proc), the CPU per event of each, the rate the two processes could
reach if only CPU bound them (each worker at most a core; workers, broker and parent at most
all cores), and, each round, what the broker serves to one and to two bare reader processes
that do nothing with the records (``benchmarks.probes.raw_readers``): on a 2-core machine the
broker shares the cores with the workers, and what it serves bounds the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections import Counter

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

import flowkit
from benchmarks import ysb_kafka
from benchmarks.kafka_broker import kafka_broker
from benchmarks.probes import raw_readers
from benchmarks.rounds import report
from benchmarks.ysb_kafka import (
    WINDOW_MS,
    broker_url,
    make_app,
    payloads,
    preload,
    reset_internal_topics,
    window_counts,
)
from examples import ysb

GROUP_VAR = "FLOWKIT_SCALE_OUT_GROUP"
POLL = 0.1  # seconds between two reads of /metrics (each costs the workers a little)
CLK_TCK = os.sysconf("SC_CLK_TCK")

Counts = Counter[tuple[str, int]]


def bench_app() -> flowkit.App:
    """The app the worker processes load: YSB under this run's own group name."""
    return make_app(name=os.environ[GROUP_VAR])


def truth(data: list[tuple[bytes, bytes, int]]) -> Counts:
    """The window counts the app must emit, counted here."""
    import msgspec

    decode = msgspec.json.Decoder(ysb.AdView).decode
    ads = ysb.campaign_map()
    counts: Counts = Counter()
    for _, value, _ in data:
        view = decode(value)
        if view.event_type == "view":
            t = view.event_time
            counts[ads[view.ad_id], t - t % WINDOW_MS] += 1
    return counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def figures(text: str) -> dict[str, float]:
    """The sums this benchmark watches, from one /metrics text."""
    out = {"records_in": 0.0, "processed": 0.0, "lag": 0.0, "assigns": 0.0, "lag_series": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "flowkit_records_in_total":
                out["records_in"] += s.value
            elif s.name == "flowkit_records_processed_total" and s.labels["agent"] == "count_views":
                out["processed"] += s.value
            elif s.name == "flowkit_consumer_lag_records":
                out["lag"] += s.value
                out["lag_series"] += 1
            elif s.name == "flowkit_rebalances_total" and s.labels["kind"] == "assign":
                out["assigns"] += s.value
    return out


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


async def one_run(
    bootstrap: str, broker_pid: int | None, processes: int, n: int, expected: Counts
) -> tuple[float, bool, dict[str, float]]:
    """One CLI run: (seconds, whether the group rebalanced mid-run, CPU seconds by role)."""
    await reset_internal_topics(bootstrap)
    port = free_port()
    web = f"http://127.0.0.1:{port}"
    env = {**os.environ, GROUP_VAR: f"ysb-scale-{uuid.uuid4().hex[:8]}"}
    cmd = [sys.executable, "-m", "flowkit.cli", "worker", "benchmarks.scale_out:bench_app"]
    cmd += ["--broker", broker_url(bootstrap), "--log-level", "warning", "--web-port", str(port)]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, stderr=asyncio.subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 600
            start = 0.0
            pids: list[int] = []
            cpu0: dict[str, float] = {}
            while True:
                if proc.returncode is not None or time.monotonic() > deadline:
                    ended = proc.returncode is not None
                    err = await proc.stderr.read() if ended and proc.stderr else b""
                    tail = err.decode(errors="replace").strip().splitlines()[-5:]
                    raise SystemExit(
                        f"{processes} process(es): no result (exit {proc.returncode})\n"
                        + "\n".join(tail)
                    )
                now = time.perf_counter()
                status, text = await get(session, web + "/metrics")
                seen = figures(text) if status == 200 else None
                if seen is not None and not start and seen["records_in"] > 0:
                    start = now
                    pids = await worker_pids(session, web, proc.pid, processes)
                    parent = proc.pid if processes > 1 else None
                    cpu0 = cpu_by_role(broker_pid, pids, parent)
                if (
                    seen is not None
                    and seen["processed"] >= n
                    and seen["lag_series"] > 0
                    and seen["lag"] == 0
                ):
                    elapsed = now - start
                    cpu1 = cpu_by_role(broker_pid, pids, parent)
                    rebalanced = seen["assigns"] > processes
                    break
                await asyncio.sleep(POLL)
        got = await window_counts(bootstrap, len(expected))
        if got != expected:
            raise SystemExit(f"{processes} process(es): the window counts are wrong")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return elapsed, rebalanced, {k: cpu1[k] - cpu0[k] for k in cpu1}


async def worker_pids(
    session: aiohttp.ClientSession, web: str, pid: int, processes: int
) -> list[int]:
    if processes == 1:
        return [pid]
    _, body = await get(session, web + "/ready")
    return [p["pid"] for p in json.loads(body or "{}").get("processes", []) if p["pid"]]


def cpu_by_role(broker_pid: int | None, workers: list[int], parent: int | None) -> dict[str, float]:
    out = {"broker": cpu_seconds(broker_pid)} if broker_pid is not None else {}
    if parent is not None:  # the supervising parent (it answers the /metrics polls)
        out["parent"] = cpu_seconds(parent)
    for i, pid in enumerate(workers, 1):
        out[f"worker {i}"] = cpu_seconds(pid)
    return out


async def run(bootstrap: str, broker_pid: int | None, events: int, repeat: int) -> None:
    data = payloads(events)
    expected = truth(data)
    size = sum(len(v) for _, v, _ in data) / len(data)
    rate = await preload(bootstrap, data)
    del data
    print(
        f"{events:,} YSB events of {size:.0f} bytes in {ysb.PARTITIONS} partitions "
        f"(produced at {rate:,.0f}/s); {os.cpu_count()} cores, the broker on the same ones"
    )
    labels = {1: "1 process", 2: "2 processes"}
    rounds: list[dict[str, float]] = []
    cpu: dict[int, dict[str, float]] = {}
    bare: dict[int, float] = {}
    for r in range(repeat):
        timings: dict[str, float] = {}
        # Alternate which goes first: a machine that slows down over a round hurts both.
        for processes in (1, 2) if r % 2 == 0 else (2, 1):
            for _attempt in range(3):
                seconds, rebalanced, used = await one_run(
                    bootstrap, broker_pid, processes, events, expected
                )
                if not rebalanced:
                    break
                print(f"  ({labels[processes]}: the group rebalanced mid-run; run again)")
            else:
                raise SystemExit(f"{labels[processes]}: every run rebalanced mid-run")
            timings[labels[processes]] = seconds
            if processes not in cpu or seconds < cpu[processes]["seconds"]:
                cpu[processes] = {"seconds": seconds, **used}
        rounds.append({label: timings[label] for label in labels.values()})
        # What the broker serves to bare readers (no app) on the same topic, 1 and 2.
        read = {n: (await raw_readers.readers(bootstrap, n))[0] for n in (1, 2)}
        bare = {n: max(bare.get(n, 0.0), rate) for n, rate in read.items()}
        print(
            f"  round {r + 1}: "
            + ", ".join(f"{k} {events / v:,.0f}/s" for k, v in timings.items())
            + f"; bare readers {read[1]:,.0f}/s and {read[2]:,.0f}/s"
            + f" (load {os.getloadavg()[0]:.1f})"
        )
    report(rounds, events, "event", [("scale-out 2 / 1 processes", "2 processes", "1 process")])
    print(
        f"bare readers (no app), best: 1 process {bare[1]:,.0f}/s, 2 processes "
        f"{bare[2]:,.0f}/s ({bare[2] / bare[1]:.2f}x): what the broker serves"
    )
    print("CPU during the fastest run of each (share of one core over the timed part):")
    per_event: dict[int, dict[str, float]] = {}
    for processes, used in cpu.items():
        seconds = used.pop("seconds")
        shares = ", ".join(f"{role} {value / seconds:.0%}" for role, value in used.items())
        total = sum(used.values()) / seconds
        print(f"  {labels[processes]:<12}: {shares}; all {total:.0%} of {os.cpu_count()} cores")
        # The same events cost about the same CPU in one or two processes when scaling is
        # clean: on a machine others share, this is the figure that does not move.
        roles = per_event[processes] = {}
        for role, value in used.items():
            kind = role.split()[0]
            roles[kind] = roles.get(kind, 0.0) + value / events * 1e6
        costs = ", ".join(f"{kind} {us:.2f}" for kind, us in roles.items())
        print(f"  {'':<12}  CPU per event (µs): {costs}")
    bound(per_event, events / min(r["1 process"] for r in rounds))
    print("(window counts identical to the expected ones in every run)")


def bound(per_event: dict[int, dict[str, float]], one: float) -> None:
    """The most one and two processes could do if only CPU bound them, from the CPU per
    event of the fastest runs: each worker has at most a core, and workers, broker and
    parent together at most the machine's cores."""
    cores = os.cpu_count() or 1
    limits = {
        n: min(n / costs.get("worker", 0.0), cores / sum(costs.values())) * 1e6
        for n, costs in per_event.items()
    }
    print(
        f"CPU bound on {cores} cores: 1 process {limits[1]:,.0f} events/s, 2 processes "
        f"{limits[2]:,.0f} events/s = {limits[2] / limits[1]:.2f}x the bound of one and "
        f"{limits[2] / one:.2f}x the best 1-process run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="flowkit --processes 2 against 1 on YSB")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="paired rounds")
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: Tansu)")
    parser.add_argument("--client", choices=("aiokafka", "rdkafka"), default="aiokafka")
    args = parser.parse_args()
    ysb_kafka.CLIENT = args.client  # the workers' broker URL says ?client=...
    # With --bootstrap the broker's CPU is not measured (its pid is None).
    with kafka_broker(args.bootstrap) as (bootstrap, pid):
        asyncio.run(run(bootstrap, pid, args.events, args.repeat))


if __name__ == "__main__":
    main()
