"""The router on the memory broker: flowkit against a hand-written loop, timed or counted.

The router's own cost without a broker's noise: ``examples/router.py``.

    python -m benchmarks.router_count --orders 20000                 # time, and compare outputs
    python -m benchmarks.router_count --instructions --orders 5000   # callgrind, clean orders
    python -m benchmarks.router_count --instructions --bad-orders 5000  # with 2.7 % bad
    python -m benchmarks.router_count --instructions --all-bad 2000  # a bad order vs a good

The same orders as ``benchmarks/router_kafka.py`` (keyed by one of 5,000 customers, on 4
partitions as a Kafka producer would place them; with ``--bad-orders``, 2 % lack their
customer and 0.7 % are not JSON) are loaded into the memory broker, then routed by:

* hand-written: the broker's logs -> ``msgspec.json.decode`` -> ``route_by_hand`` (the three
  routes written by hand) -> encoded outputs appended to one list per destination
  partition, a dead letter (its value and four headers) for each bad record;
* flowkit: ``make_app(demo_traffic=False)`` in a ``flowkit.Worker`` until every order is
  processed and every output and dead letter stored.

Both produce the same outputs (checked). ``--instructions`` counts each under callgrind
(``benchmarks/callgrind.py``): instructions per order, the steady state of flowkit, and
the ratios. Counted, the worker runs on a clock that stands still (``FakeClock``): its
timers (a checkpoint every second, the log budget's 10 s window, the status line) would
otherwise fire as often as the run's wall-clock time allows, which under callgrind is
minutes and grows with the machine's load. So the counts do not depend on the load: the
worker checkpoints once, at its stop, and logs the first 20 errors of a burst.

``--all-bad N`` is a burst: every order is bad, in the 2.7 % run's proportions (three in
four lack their customer, so a transform fails; one in four is not JSON). With
``--instructions`` it prints flowkit's steady-state instructions per bad order beside
those per clean order (runs of N and N/5 of each), and their ratio: what a bad record
costs against a good one.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter

import msgspec

import flowkit
from benchmarks.callgrind import compare, count
from benchmarks.router_kafka import PARTITIONS, ROUTE_TOPICS, orders, route_by_hand
from examples import router
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker, MemoryTransport

SOURCE = "orders-in"
DLQ = "router-dlq"


def all_bad(n: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of ``n`` bad orders: the clean orders' keys, three in four without
    their customer (a transform fails), one in four cut mid-object (not JSON)."""
    rng, junk = random.Random(7), random.Random(8)
    enc = msgspec.json.Encoder()
    out = []
    for i in range(n):
        order = router.sample_order(rng, i)
        order.pop("customer", None)
        value = enc.encode(order)
        if junk.random() < 0.26:
            value = value[: len(value) // 2]
        out.append((f"c{i % 5000}".encode(), value))
    return out


async def loaded_broker(data: list[tuple[bytes, bytes]]) -> MemoryBroker:
    """The orders in a 4-partition topic, each on its key's partition."""
    broker = MemoryBroker(retention_records=None)
    broker.create_topic(SOURCE, PARTITIONS)
    for topic in ROUTE_TOPICS:
        broker.create_topic(topic, PARTITIONS)
    broker.create_topic(DLQ, 1)
    producer = MemoryTransport(broker).producer()
    for key, value in data:
        await producer.send(SOURCE, value, key=key, partition=partition_for_key(key, PARTITIONS))
    return broker


def hand_written(broker: MemoryBroker) -> Counter[str]:
    """Route every stored order by hand; the number of records per destination."""
    decode, encode = msgspec.json.decode, msgspec.json.Encoder().encode
    out: dict[tuple[str, int], list[tuple[bytes | None, bytes]]] = {}
    letters: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
    partition_of: dict[bytes | None, int] = {}
    for p in range(PARTITIONS):
        for m in broker.messages(SOURCE, p):
            try:
                outs = route_by_hand(decode(m.value))
            except Exception as exc:
                headers = [
                    ("error.type", type(exc).__name__.encode()),
                    ("source.topic", m.topic.encode()),
                    ("source.partition", str(m.partition).encode()),
                    ("source.offset", str(m.offset).encode()),
                ]
                letters.append((m.key, m.value, headers))
                continue
            if not outs:
                continue
            q = partition_of.get(m.key)
            if q is None:
                q = partition_of[m.key] = partition_for_key(m.key, PARTITIONS)  # type: ignore[arg-type]
            for topic, value in outs:
                out.setdefault((topic, q), []).append((m.key, encode(value)))
    counts: Counter[str] = Counter({DLQ: len(letters)})
    for (topic, _), records in out.items():
        counts[topic] += len(records)
    return counts


async def with_flowkit(broker: MemoryBroker, n: int, *, counted: bool = False) -> Counter[str]:
    """Run the router example over the broker until all ``n`` orders are routed.

    ``counted``: under callgrind, where a run lasts a minute or more and that time depends
    on the machine's load, the worker's timers run on a clock that stands still, so none
    fires mid-measurement: no checkpoint every second (the stop checkpoints once), one
    window of the log budget (its first 20 lines, not 20 more every 10 s), no status line.
    Otherwise the count would grow with the time the run took.
    """
    app = router.make_app(demo_traffic=False, source=SOURCE)
    clock = FakeClock() if counted else None
    worker = flowkit.Worker(
        app,
        transport=MemoryTransport(broker),
        clock=clock,
        status_interval=None if counted else 30.0,
    )
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < n or not worker.is_idle():
            if worker.error is not None:
                raise SystemExit(f"the flowkit worker stopped: {worker.error!r}")
            await asyncio.sleep(0.001)
    counts: Counter[str] = Counter()
    for topic in [*ROUTE_TOPICS, DLQ]:
        for p in range(broker.partition_count(topic) or 0):
            counts[topic] += len(broker.messages(topic, p))
    return counts


async def _part(data: list[tuple[bytes, bytes]], part: str) -> None:
    broker = await loaded_broker(data)  # in every part: the differences are the loops alone
    if part == "hand":
        hand_written(broker)
    elif part == "flowkit":
        await with_flowkit(broker, len(data), counted=True)


async def _timed(data: list[tuple[bytes, bytes]]) -> None:
    n = len(data)
    hand_broker = await loaded_broker(data)
    start = time.perf_counter()
    expected = hand_written(hand_broker)
    t_hand = time.perf_counter() - start
    broker = await loaded_broker(data)
    start = time.perf_counter()
    got = await with_flowkit(broker, n)
    t_flow = time.perf_counter() - start
    if got != expected:
        raise SystemExit(f"outputs differ: flowkit {dict(got)}, hand-written {dict(expected)}")
    outs = sum(v for k, v in got.items() if k != DLQ)
    print(f"{n:,} orders, {outs / n:.2f} outputs per order, {got[DLQ]} dead letters")
    print(f"hand-written {n / t_hand:,.0f}/s, flowkit {n / t_flow:,.0f}/s: {t_hand / t_flow:.2f}")


def bad_against_good(n: int) -> None:
    """Print flowkit's steady-state instructions per bad order and per clean order."""

    def steady(flag: str) -> float:
        def own(size: int) -> int:
            module = "benchmarks.router_count"
            return count(module, "flowkit", flag, size) - count(module, "setup", flag, size)

        return (own(n) - own(n // 5)) / (n - n // 5)

    good, bad = steady("--orders"), steady("--all-bad")
    print(f"{n:,} orders, flowkit's instructions per order (callgrind, steady state)")
    print(f"clean orders             : {good:>10,.0f}")
    print(f"all orders bad           : {bad:>10,.0f}")
    print(f"a bad order / a good one : {bad / good:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--orders", type=int, help="clean orders (default 20,000)")
    size.add_argument("--bad-orders", type=int, help="orders of which 2.7 %% are bad")
    size.add_argument("--all-bad", type=int, help="orders that are all bad (a burst)")
    parser.add_argument(
        "--instructions", action="store_true", help="compare instruction counts under valgrind"
    )
    parser.add_argument("--part", choices=["setup", "hand", "flowkit"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("critical")  # the bad records' log lines are not what is measured
    if args.all_bad is not None:
        if args.instructions:
            bad_against_good(args.all_bad)
            return
        data = all_bad(args.all_bad)
    else:
        bad = args.bad_orders is not None
        n: int = args.bad_orders if bad else (args.orders or 20_000)
        if args.instructions:
            compare("benchmarks.router_count", "--bad-orders" if bad else "--orders", n, "order")
            return
        data = orders(n, bad=bad)
    if args.part:
        asyncio.run(_part(data, args.part))
        return
    asyncio.run(_timed(data))


if __name__ == "__main__":
    main()
