"""A windowed stream-stream join: flowkit vs a hand-written loop, same data, same process.

    python -m benchmarks.joins [--orders 200000] [--repeat 5]
    python -m benchmarks.joins --rocksdb   # also the join's buffers on rocksdb://
    python -m benchmarks.joins --instructions --orders 20000   # callgrind counts
    python -m benchmarks.joins --instructions --breakdown --rocksdb   # + the store alone
    python -m benchmarks.joins --buffered 1000000   # memory of a join holding 1 M records

The data is ``examples/payments.py``'s: N orders, one every 100 ms of event time, and a
payment for 90% of them, up to 20 s after (or 2 s before) its order, both keyed by order
id on 4 partitions. The query is the example's left join within 60 s (grace 10 s): each
order comes out once, with its payment or, once its window has closed, without, encoded as
the example's ``PaidOrder`` or ``UnpaidOrder``.

* hand-written: the records in timestamp order, decoded with msgspec; per side a dict of
  the records waiting for a match (key -> list, so a key may have several), matched by
  key within the window; stream time, late records, unmatched orders emitted when their
  window closes and both sides expired from the dicts when no record that is not late
  could match them (two deques in timestamp order); results encoded with msgspec and
  appended to two lists. The same semantics as the join, written for this data (it
  relies on timestamps arriving in order, which a general join cannot);
* flowkit: the example app run by a worker over both topics pre-loaded on the memory
  broker (timestamp-ordered merge per partition, changelog-backed buffers, outputs sent
  to two topics), timed until every record is processed and the worker has stopped (its
  last checkpoint included), then checked against the hand-written result;
* with ``--rocksdb``, flowkit again with the join's buffers on ``rocksdb://`` (in a fresh
  data directory each round), in the same rounds, and its rate against the memory store's.

With ``--instructions --breakdown`` the join's store alone is counted too (each record
decoded and given to it, without a worker), and with ``--rocksdb`` also on ``rocksdb://``,
with a checkpoint every ``CHECKPOINT_EVERY`` records (the worker checkpoints once a second,
so the records between two of them depend on its speed).

``--buffered N`` measures memory instead: the join's store alone (as ``--breakdown``
counts it) is given N orders and payments of distinct keys, in timestamp order, with a
window of a week, so none matches and none expires: it holds all N. A checkpoint (drain,
then persist) every 10,000 records. Each store runs in a process of its own, which prints
its rate (in wall-clock and CPU time, RocksDB's threads included) and its resident memory
before, at half and at the end, and its peak.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

import flowkit
from benchmarks.callgrind import compare, count
from benchmarks.rounds import against_hand_written
from examples import payments
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.records import TopicPartition
from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker, MemoryTransport, read_to_end

START_MS = 1_700_000_000_000
Data = list[tuple[str, bytes, bytes, int]]  # (topic, key, value, timestamp)
Result = tuple[list[bytes], list[bytes]]  # (paid orders, unpaid orders) as encoded, sorted


def data_set(n: int) -> Data:
    enc = msgspec.json.Encoder()
    return [
        (topic, key.encode(), enc.encode(value), ts)
        for topic, key, value, ts in payments.sample(n, start_ms=START_MS)
    ]


def join(records: Iterable[tuple[str, bytes, bytes, int]]) -> Result:
    """The hand-written left join over (topic, key, value, timestamp) in time order."""
    decode_order = msgspec.json.Decoder(payments.Order).decode
    decode_payment = msgspec.json.Decoder(payments.Payment).decode
    encode = msgspec.json.Encoder().encode
    paid_order, unpaid_order = payments.PaidOrder, payments.UnpaidOrder
    before = after = int(payments.WITHIN * 1000)
    grace = int(payments.GRACE * 1000)
    order_open = after + grace  # an order may still be paid this long after it
    payment_open = before + grace
    keep = before + after + grace  # then no record that is not late can match it
    orders: dict[bytes, list[list[Any]]] = {}  # key -> [timestamp, order, matched, key]
    waiting: dict[bytes, list[list[Any]]] = {}  # key -> [timestamp, payment, key]
    closing: deque[list[Any]] = deque()  # orders whose window has not closed
    expiring: deque[tuple[list[Any], dict[bytes, list[list[Any]]]]] = deque()
    paid: list[bytes] = []
    unpaid: list[bytes] = []
    now = -(2**62)
    late = 0
    for topic, key, raw, ts in records:
        if ts > now:
            now = ts
        if topic == "orders":
            if ts + order_open < now:
                late += 1
                continue
            order = decode_order(raw)
            entry = [ts, order, False, key]
            for p in waiting.get(key, ()):
                if ts - before <= p[0] <= ts + after:
                    entry[2] = True
                    paid.append(
                        encode(paid_order(order.id, order.customer, order.amount, p[1].method))
                    )
            same = orders.get(key)
            if same is None:
                orders[key] = [entry]
            else:
                same.append(entry)
            closing.append(entry)
            expiring.append((entry, orders))
        else:
            if ts + payment_open < now:
                late += 1
                continue
            payment = decode_payment(raw)
            entry = [ts, payment, key]
            for o in orders.get(key, ()):
                if ts - after <= o[0] <= ts + before:
                    o[2] = True
                    order = o[1]
                    paid.append(
                        encode(paid_order(order.id, order.customer, order.amount, payment.method))
                    )
            same = waiting.get(key)
            if same is None:
                waiting[key] = [entry]
            else:
                same.append(entry)
            expiring.append((entry, waiting))
        while closing and closing[0][0] + order_open < now:
            o = closing.popleft()
            if not o[2]:
                order = o[1]
                unpaid.append(encode(unpaid_order(order.id, order.customer, order.amount)))
        while expiring and expiring[0][0][0] + keep < now:
            e, side = expiring.popleft()
            same = side[e[-1]]
            if len(same) == 1:
                del side[e[-1]]
            else:
                same.remove(e)
    for o in closing:  # the end of the data closes every window
        if not o[2]:
            order = o[1]
            unpaid.append(encode(unpaid_order(order.id, order.customer, order.amount)))
    return sorted(paid), sorted(unpaid)


def hand_written(data: Data) -> tuple[float, Result]:
    start = time.perf_counter()
    result = join(data)
    return time.perf_counter() - start, result


def hand_written_over_logs(broker: MemoryBroker) -> float:
    """The same loop over what a consumer reads: each partition's two logs merged by
    timestamp."""

    def log(topic: str, p: int) -> Any:
        return ((m.timestamp, topic, m.key, m.value) for m in broker.messages(topic, p) if m.key)

    start = time.perf_counter()
    for p in range(payments.PARTITIONS):
        merged = heapq.merge(log("orders", p), log("payments", p), key=lambda r: r[0])
        join((t, k, v, ts) for ts, t, k, v in merged)
    return time.perf_counter() - start


async def loaded_broker(data: Data) -> MemoryBroker:
    broker = MemoryBroker(retention_records=None)
    producer = MemoryTransport(broker).producer()
    for topic in ("orders", "payments"):
        broker.create_topic(topic, payments.PARTITIONS)
    for topic, key, raw, ts in data:
        await producer.send(topic, bytes(memoryview(raw)), key=key, timestamp_ms=ts)
    end = data[-1][3] + 3_600_000
    for p in range(payments.PARTITIONS):  # one keyless record far ahead closes every window
        await producer.send("orders", b"{}", key=None, partition=p, timestamp_ms=end)
    return broker


async def run_worker(
    broker: MemoryBroker, total: int, clock: Any = None, data_dir: str | None = None
) -> None:
    """Run the example app until it has processed ``total`` records, then stop it; with a
    ``data_dir``, the join's buffers are on ``rocksdb://`` there."""
    app = payments.make_app(generate=False)
    if data_dir is not None:
        app.tables["settled"].store_kind = "rocksdb://"  # type: ignore[attr-defined]
    worker = flowkit.Worker(app, transport=MemoryTransport(broker), clock=clock, data_dir=data_dir)
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < total or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


async def with_flowkit(data: Data, rocksdb: bool = False) -> tuple[float, Result, float]:
    broker = await loaded_broker(data)
    data_dir = tempfile.mkdtemp(prefix="joins-bench-") if rocksdb else None
    start = time.perf_counter()
    try:
        await run_worker(broker, len(data) + payments.PARTITIONS, data_dir=data_dir)
    finally:
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    elapsed = time.perf_counter() - start
    reader = MemoryTransport(broker).consumer(group_id=None)
    out: dict[str, list[bytes]] = {"paid-orders": [], "unpaid-orders": []}
    tps = {TopicPartition(t, p) for t in out for p in range(payments.PARTITIONS)}
    reader.assign(tps)

    def add(tp: TopicPartition, messages: list[flowkit.Message]) -> None:
        out[tp.topic].extend(m.value for m in messages if m.value is not None)

    await read_to_end(reader, tps, add)
    result = (sorted(out["paid-orders"]), sorted(out["unpaid-orders"]))
    return elapsed, result, hand_written_over_logs(broker)


def by_partition(data: Data) -> list[tuple[int, int, bytes, bytes, int]]:
    """(side, partition, key, value, timestamp) of each record, in timestamp order."""
    return [
        (0 if topic == "orders" else 1, partition_for_key(key, payments.PARTITIONS), key, raw, ts)
        for topic, key, raw, ts in data
    ]


# ``store_only`` on rocksdb://: records between two checkpoints (drain, then persist).
CHECKPOINT_EVERY = 10_000


def store_only(
    records: list[tuple[int, int, bytes, bytes, int]],
    rocksdb: bool = False,
    every: int = CHECKPOINT_EVERY,
) -> int:
    """The join's own work, without a worker: each record (in timestamp order, as the
    merge hands them over) decoded and given to the store; returns the results. With
    ``rocksdb``, the buffers on ``rocksdb://`` (a fresh data directory) and a checkpoint
    every ``every`` records."""
    from flowkit.state.joins.rocks import RocksJoinStore

    app = payments.make_app(generate=False)
    join = app.tables["settled"]
    # The wall clock at the data's end (the records are in timestamp order): no timestamp
    # is beyond the join's max_future.
    now_ms = records[-1][4] if records else START_MS
    data_dir = tempfile.mkdtemp(prefix="joins-store-") if rocksdb else None
    if data_dir is not None:
        store = RocksJoinStore(
            join,  # type: ignore[arg-type]
            lambda: now_ms,
            data_dir=Path(data_dir),
            broker="memory://",
        )
    else:
        store = join.new_store(lambda: now_ms)  # type: ignore[attr-defined]
    try:
        return _feed(store, app, records, every)
    finally:
        if data_dir is not None:
            store.aclose()
            shutil.rmtree(data_dir, ignore_errors=True)


def _feed(
    store: Any, app: flowkit.App, records: list[tuple[int, int, bytes, bytes, int]], every: int
) -> int:
    from flowkit.state.joins.rocks import RocksJoinStore

    store.assign(range(payments.PARTITIONS))
    parts = [store.part(p) for p in range(payments.PARTITIONS)]
    decoders = (app.topics["orders"].decoder(), app.topics["payments"].decoder())
    offsets = [0] * (2 * payments.PARTITIONS)
    results = 0
    process, settle = store.process, store.settle
    on_disk = isinstance(store, RocksJoinStore)
    changelog = [0] * payments.PARTITIONS
    for n, (side, p, key, raw, ts) in enumerate(records, 1):
        offset = offsets[2 * p + side]
        offsets[2 * p + side] = offset + 1
        part = parts[p]
        out = process(part, side, key, offset, ts, raw, decoders[side](raw))
        if out:
            results += len(out)
            if part.settle:
                settle(part)
        if on_disk:  # (the memory store's count stays that of process and settle)
            part.high[side] = offset
            part.done = part.time
            if n % every == 0:
                for q, _, _ in store.drain_changes():
                    changelog[q] += 1
                store.persist(dict(enumerate(changelog)))
    return results


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def hold(n: int, store_kind: str) -> dict[str, float]:
    """Feed ``n`` records that match nothing to a join's store on ``store_kind``; its rate
    and memory (``--buffered``)."""
    from flowkit.state.joins.rocks import RocksJoinStore

    app = flowkit.App("held", partitions=1)
    orders = app.topic("orders", value_type=payments.Order, partitions=1)
    paid = app.topic("payments", value_type=payments.Payment, partitions=1)
    join = app.join(orders, paid, within=7 * 86_400.0, how="left", name="held")
    now_ms = START_MS + n
    data_dir = tempfile.mkdtemp(prefix="joins-held-")
    store = (
        RocksJoinStore(join, lambda: now_ms, data_dir=Path(data_dir), broker="memory://")
        if store_kind == "rocksdb"
        else join.new_store(lambda: now_ms)
    )
    store.assign([0])
    part = store.part(0)
    enc = msgspec.json.Encoder()
    decoders = (orders.decoder(), paid.decoder())
    base = _rss_mb()
    half = 0.0
    changelog = 0
    start, cpu = time.perf_counter(), time.process_time()
    try:
        for i in range(n):
            side = i & 1
            key = f"k{i:09d}".encode()
            if side:
                raw = enc.encode(payments.Payment(key.decode(), 1234, "card"))
            else:
                raw = enc.encode(payments.Order(key.decode(), "customer-42", 1234))
            store.process(part, side, key, i >> 1, START_MS + i, raw, decoders[side](raw))
            part.high[side] = i >> 1
            part.done = part.time
            if i % 10_000 == 9_999:
                changelog += len(store.drain_changes())
                if isinstance(store, RocksJoinStore):
                    store.persist({0: changelog})
            if i == n // 2:
                half = _rss_mb()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu  # the process's threads: RocksDB's too
        end = _rss_mb()
    finally:
        if isinstance(store, RocksJoinStore):
            store.aclose()
        shutil.rmtree(data_dir, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "rate": n / elapsed,
        "cpu": n / cpu,
        "base": base,
        "half": half,
        "end": end,
        "peak": peak,
    }


def buffered(n: int) -> None:
    """Print ``hold``'s figures for both stores, each run in a fresh process."""
    print(f"{n:,} records held by a join's store (none matches, none expires)")
    print(
        f"{'store':<10}{'records/s':>12}{'per CPU s':>12}"
        f"{'MB before':>11}{'at half':>9}{'at end':>9}{'peak':>8}"
    )
    for kind in ("memory", "rocksdb"):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.joins", "--hold", kind, "--buffered", str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{kind:<10}{r['rate']:>12,.0f}{r['cpu']:>12,.0f}{r['base']:>11,.0f}{r['half']:>9,.0f}"
            f"{r['end']:>9,.0f}{r['peak']:>8,.0f}"
        )


async def _load_and_maybe_run(data: Data, run: bool) -> None:
    broker = await loaded_broker(data)
    if run:  # a fake clock: no checkpoint but the last, the same count every time
        # At the data's end, so the record that closes every window (an hour after the
        # last) is within the join's max_future.
        clock = FakeClock(data[-1][3] / 1000)
        await run_worker(broker, len(data) + payments.PARTITIONS, clock)


def main() -> None:
    parser = argparse.ArgumentParser(description="A stream-stream join: flowkit vs by hand")
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare instruction counts under valgrind (use --orders 20000)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="with --instructions: also count the join's store alone, without a worker",
    )
    parser.add_argument(
        "--rocksdb",
        action="store_true",
        help="also run flowkit with the join's buffers on rocksdb:// (the rocksdb extra)",
    )
    parser.add_argument(
        "--buffered",
        type=int,
        metavar="N",
        help="measure the memory of a join's store holding N records, on both stores",
    )
    parser.add_argument(
        "--part",
        choices=["setup", "hand", "flowkit", "store", "store-rocksdb"],
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--hold", choices=["memory", "rocksdb"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("warning")
    if args.buffered:
        if args.hold:
            print(json.dumps(hold(args.buffered, args.hold)))
        else:
            buffered(args.buffered)
        return
    if args.instructions:
        if args.breakdown:
            setup = count("benchmarks.joins", "setup", "--orders", args.orders)
            store = count("benchmarks.joins", "store", "--orders", args.orders) - setup
            print(f"the join's store alone     : {store / args.orders:>10,.0f} per order")
            if args.rocksdb:
                disk = count("benchmarks.joins", "store-rocksdb", "--orders", args.orders) - setup
                print(f"the store alone, rocksdb://: {disk / args.orders:>10,.0f} per order")
                print(f"memory / rocksdb           : {store / disk:>10.2f}")
        compare("benchmarks.joins", "--orders", args.orders, "order")
        print("(an order is ~1.9 records: the order and, for 90% of them, its payment)")
        return
    data = data_set(args.orders)
    if args.part:
        # The broker is loaded in every part, so the differences are the loops alone.
        records = by_partition(data)
        asyncio.run(_load_and_maybe_run(data, args.part == "flowkit"))
        if args.part == "hand":
            join(data)
        elif args.part in ("store", "store-rocksdb"):
            store_only(records, rocksdb=args.part == "store-rocksdb")
        return
    print(f"{args.orders:,} orders and {len(data) - args.orders:,} payments, left join")
    others = []
    between = []
    if args.rocksdb:
        others = [("flowkit on rocksdb", lambda: asyncio.run(with_flowkit(data, rocksdb=True)))]
        between = [("rocksdb / memory", "flowkit on rocksdb", "flowkit")]
    against_hand_written(
        args.repeat,
        len(data),
        "record",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data)),
        "flowkit's join results differ from the hand-written loop's",
        others,
        between,
    )
    print("join results: identical to the hand-written loop's in every round")


if __name__ == "__main__":
    main()
