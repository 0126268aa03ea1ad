"""Instructions a record on librdkafka (callgrind): flowkit against hand-written loops.

YSB events and router orders, against the hand-written confluent-kafka loops of
``benchmarks.ysb_clients`` and ``benchmarks.router_kafka``.

    python -m benchmarks.rdkafka_count [--sizes 20000,60000] [--only ysb|router]

For each size it starts a Tansu broker (outside valgrind), pre-loads that many YSB events
and clean router orders, then runs each contender in a process of its own under
``valgrind --tool=callgrind`` (every thread of the process counted, librdkafka's
included) until it has processed them all. The instructions a record are the difference
between the two sizes' totals over the difference in records, so the interpreter's start,
the imports, the group join and the worker's start and stop cancel out. CPU time on a
shared machine moves with the load; these counts move only with the code (and a little
with timing: librdkafka's threads wake on timers, so expect about 1 % between runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import uuid

import flowkit
from benchmarks import router_kafka as rk
from benchmarks import ysb_kafka as yk
from benchmarks.callgrind import run
from benchmarks.kafka_broker import kafka_broker
from examples import router
from flowkit.logs import configure_logging

MAX_RECORDS = 10_000  # per fetch, on both sides
PARTS = {
    "ysb": ("ysb-hand", "ysb-flowkit"),
    "router": ("router-hand", "router-flowkit"),
}
ROUTER_SOURCE = "router-count-in"
# Under valgrind everything runs 50-100 times slower, librdkafka's heartbeat thread too: the
# benchmarks' 2 s sessions expired there now and then, and the rebalance that followed
# read records twice. Longer sessions keep each run's work the same.
SLOW_GROUP = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 3_000}


def _url(bootstrap: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {**yk.GROUP_SETTINGS, "client": "rdkafka"}.items())
    return f"kafka://{bootstrap}?{query}"


async def _flowkit(app: flowkit.App, bootstrap: str, n: int) -> None:
    worker = flowkit.Worker(app, broker=_url(bootstrap), max_fetch_records=MAX_RECORDS)
    async with worker:
        # Rarely asked: every look at the worker costs instructions, and a run under
        # valgrind lasts long, so the timed benchmarks' 2 ms polls would count as work
        # that grows with the run's duration, not with its records.
        while not yk._done(worker, n):
            if worker.error is not None or worker.stopping:
                raise SystemExit(f"the flowkit worker stopped: {worker.error!r}")
            await asyncio.sleep(0.25)


def part(name: str, n: int, bootstrap: str) -> None:
    """Run one contender over ``n`` records (in the process valgrind watches)."""
    tag = uuid.uuid4().hex[:8]
    yk.GROUP_SETTINGS.update(SLOW_GROUP)  # the settings both sides' consumers are made with
    rk.GROUP_SETTINGS.update(SLOW_GROUP)
    if name == "ysb-hand":
        yk._rd_loop(bootstrap, n, MAX_RECORDS, query=True)
    elif name == "ysb-flowkit":
        asyncio.run(_flowkit(yk.make_app(name=f"ysb-count-{tag}"), bootstrap, n))
    elif name == "router-hand":
        outputs = {f"{t}-{tag}": rk.PARTITIONS for t in rk.ROUTE_TOPICS}
        asyncio.run(rk.create(bootstrap, {**outputs, f"hand-{tag}-dlq": 1}))
        rk.BOOTSTRAP[0] = bootstrap
        rk.hand_written_rdkafka(ROUTER_SOURCE, n, tag, MAX_RECORDS)
    elif name == "router-flowkit":
        routes = [{**r, "to": [f"{t}-{tag}" for t in r["to"]]} for r in router.ROUTES]
        app = router.make_app(
            routes, demo_traffic=False, name=f"flowkit-{tag}", source=ROUTER_SOURCE
        )
        asyncio.run(_flowkit(app, bootstrap, n))
    else:
        raise SystemExit(f"unknown part {name!r}")


async def _preload(bootstrap: str, n: int, which: list[str]) -> None:
    if "ysb" in which:
        await yk.preload(bootstrap, yk.payloads(n))
    if "router" in which:
        await rk.preload(bootstrap, ROUTER_SOURCE, rk.orders(n, bad=False))


def _count(name: str, n: int, env: dict[str, str]) -> int:
    with run("benchmarks.rdkafka_count", name, "--records", n, env=env) as (stderr, _):
        match = re.search(r"Collected : (\d+)", stderr)
    if match is None:
        raise SystemExit(f"no instruction count from valgrind:\n{stderr[-2000:]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,60000", help="two record counts")
    parser.add_argument("--only", choices=sorted(PARTS), help="one workload only")
    parser.add_argument("--flowkit-only", action="store_true", help="skip the hand-written loops")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # in the process under valgrind
    parser.add_argument("--records", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("error")
    if args.part is not None:
        part(args.part, args.records, os.environ["RDKAFKA_COUNT_BOOTSTRAP"])
        return
    small, large = (int(s) for s in args.sizes.split(","))
    which = [args.only] if args.only else list(PARTS)
    totals: dict[str, dict[int, int]] = {}
    for n in (small, large):
        with kafka_broker(None) as (bootstrap, _):
            asyncio.run(_preload(bootstrap, n, which))
            env = {"RDKAFKA_COUNT_BOOTSTRAP": bootstrap}
            for w in which:
                for name in PARTS[w][1:] if args.flowkit_only else PARTS[w]:
                    total = _count(name, n, env)
                    totals.setdefault(name, {})[n] = total
                    print(f"{name} {n:,}: {total:,} instructions", flush=True)
    print(f"\ninstructions a record (callgrind, runs of {small:,} and {large:,})")
    for w in which:
        hand_name, flow_name = PARTS[w]
        flow = (totals[flow_name][large] - totals[flow_name][small]) / (large - small)
        if args.flowkit_only:
            print(f"{w:7s} flowkit {flow:>9,.0f}")
            continue
        hand = (totals[hand_name][large] - totals[hand_name][small]) / (large - small)
        print(
            f"{w:7s} hand-written {hand:>9,.0f}  flowkit {flow:>9,.0f}"
            f"  hand / flowkit {hand / flow:.2f}"
        )


if __name__ == "__main__":
    main()
