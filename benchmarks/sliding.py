"""Sliding windows: flowkit against a hand-written loop, same data, same process.

    python -m benchmarks.sliding [--clicks 200000] [--repeat 5] [--rocksdb]
    python -m benchmarks.sliding --instructions --clicks 20000    # callgrind counts
    python -m benchmarks.sliding --rss --clicks 400000 --users 100000 --expires 3600

The data: N clicks of 5,000 users, keyed by user on 4 partitions, one every 10 ms of
event time with up to 200 ms of disorder, so a user clicks every 50 s on average, in
bursts; then one click far ahead per partition, which closes every window. The query
counts each user's clicks over the last 60 s, with a grace of 10 s (Kafka Streams'
``SlidingWindows``): a window ``[t - 60 s, t]`` ending at each click and one starting
just after each click that another follows within 60 s, each count emitted once, when
stream time minus grace passes the window's end.

* hand-written: each partition's records in order, decoded with msgspec; per partition a
  dict of each user's click times (sorted, with counts) and a heap of window ends; stream
  time, late records, and at each close the clicks inside the window counted by bisection.
  The same semantics, written for this data (one partition per key, one process);
* flowkit: ``table.sliding(60.0, grace=10.0)`` with ``on_close``, run by a worker over the
  topic pre-loaded on the memory broker (two phases: every click shipped to its owner,
  changelog included), timed until every record is processed and the worker has stopped;
  its windows are compared with the hand-written loop's.

``--rocksdb`` runs flowkit on ``rocksdb://`` too (a fresh data directory each round), in
the same paired rounds, and prints the ratio of the two stores. ``--rss`` runs flowkit
once per store, each in a process of its own, and prints how much its peak RSS grew over
the broker loaded with the data (the changelog's records dropped as they are written);
``--users`` and ``--expires`` (how long records stay after their windows closed, so
readable) set how much state there is.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import heapq
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgspec

import flowkit
from benchmarks.callgrind import compare
from benchmarks.clicks import (
    PARTITIONS,
    USERS,
    Click,
    Data,
    Result,
    data_set,
    loaded_broker,
    rss_of,
    rss_pair,
    run_on,
)
from benchmarks.rounds import against_hand_written
from benchmarks.ysb import Seconds
from flowkit.logs import configure_logging
from flowkit.transports import MemoryBroker

SIZE_MS, GRACE_MS = 60_000, 10_000


def sliding(records: list[tuple[bytes, int]]) -> Result:
    """The hand-written sliding count over one partition's (value, timestamp) records."""
    decode = msgspec.json.Decoder(Click).decode
    size, grace = SIZE_MS, GRACE_MS
    by_user: dict[str, list[list[int]]] = {}  # user -> [[time, clicks], ...] by time
    ends: list[tuple[int, int, str, int]] = []  # (end, n, user, time of the click)
    out: Result = []
    now = -(2**62)
    n = 0
    first = itemgetter(0)
    for raw, _ in records:
        click = decode(raw)
        ts = click.t
        if ts > now:
            now = ts
            close = now - grace
            while ends and ends[0][0] < close:
                end, _, user, t = heapq.heappop(ends)
                own = by_user[user]
                if end == t or _after(own, t, end):
                    start = end - size
                    i = bisect.bisect_left(own, start, key=first)
                    count = 0
                    while i < len(own) and own[i][0] <= end:
                        count += own[i][1]
                        i += 1
                    out.append((user, start, end, count))
                if end != t:  # t's last window: clicks up to t are needed no more
                    del own[: bisect.bisect_right(own, t, key=first)]
                    if not own:
                        del by_user[user]
        if not click.user:
            continue
        close = now - grace
        if ts + size < close:
            continue  # late
        user = click.user
        own = by_user.setdefault(user, [])
        if not own or own[-1][0] < ts:
            own.append([ts, 1])
        else:
            i = bisect.bisect_left(own, ts, key=first)
            if own[i][0] == ts:
                own[i][1] += 1
                continue
            own.insert(i, [ts, 1])
        for end in (ts, ts + 1 + size):
            if end >= close:
                n += 1
                heapq.heappush(ends, (end, n, user, ts))
    return out


def _after(own: list[list[int]], t: int, end: int) -> bool:
    """Whether the window just after ``t`` exists and is not the one ending at a click:
    a click follows ``t`` within it, and none is at its very end."""
    j = bisect.bisect_right(own, t, key=itemgetter(0))
    if j == len(own) or own[j][0] > end:
        return False
    k = bisect.bisect_left(own, end, key=itemgetter(0))
    return k == len(own) or own[k][0] != end


def hand_written(data: Data) -> tuple[Seconds, Result]:
    start, cpu = time.perf_counter(), time.process_time()
    parts: list[list[tuple[bytes, int]]] = [[] for _ in range(PARTITIONS)]
    for p, _, raw, ts in data:
        parts[p].append((raw, ts))
    out: Result = []
    for records in parts:
        out.extend(sliding(records))
    return Seconds(time.perf_counter() - start, time.process_time() - cpu), sorted(out)


def hand_written_over_logs(broker: MemoryBroker) -> Seconds:
    start, cpu = time.perf_counter(), time.process_time()
    for p in range(PARTITIONS):
        sliding([(m.value, m.timestamp) for m in broker.messages("clicks", p) if m.value])
    return Seconds(time.perf_counter() - start, time.process_time() - cpu)


def make_app(
    closed: Result, data_dir: Path | None = None, expires: float | None = None
) -> flowkit.App:
    """The query; with ``data_dir``, its table on ``rocksdb://`` there."""
    on_disk: dict[str, Any] = (
        {} if data_dir is None else {"store": "rocksdb://", "data_dir": data_dir}
    )
    app = flowkit.App("slidingbench", partitions=PARTITIONS, **on_disk)
    clicks: flowkit.Topic[Click] = app.topic("clicks", value_type=Click)

    def on_close(user: str, window: flowkit.Window, count: int) -> None:
        closed.append((user, window.start, window.end, count))

    recent = app.table("recent", default=int).sliding(
        SIZE_MS / 1000,
        grace=GRACE_MS / 1000,
        expires=expires,
        time=lambda c: c.t,
        on_close=on_close,
        late="drop",
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            if click.user:
                recent.add(click.user, 1, click.t)

    return app


async def with_flowkit(
    data: Data, store: str = "memory", expires: float | None = None
) -> tuple[Seconds, Result, Seconds]:
    elapsed, closed, broker = await run_on(data, make_app, store, expires)
    return elapsed, closed, hand_written_over_logs(broker)


def main() -> None:
    parser = argparse.ArgumentParser(description="Sliding windows: flowkit vs by hand")
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--rocksdb", action="store_true", help="flowkit on rocksdb:// too, in the same rounds"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare instruction counts under valgrind (use --clicks 20000)",
    )
    parser.add_argument("--expires", type=float, default=None, help="seconds (the default's)")
    parser.add_argument("--rss", action="store_true", help="each store's peak RSS growth")
    parser.add_argument("--store", choices=["memory", "rocksdb"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--part", choices=["setup", "hand", "flowkit", "rss"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    configure_logging("warning")
    if args.instructions:
        compare("benchmarks.sliding", "--clicks", args.clicks, "click")
        return
    if args.rss:
        print(f"{args.clicks:,} clicks of {args.users:,} users, expires {args.expires} s")
        rss_pair("benchmarks.sliding", args, "windows")
        return
    data = data_set(args.clicks, args.users)
    if args.part == "rss":
        asyncio.run(
            rss_of(
                data,
                make_app,
                "slidingbench-recent-changelog",
                args.store or "memory",
                args.expires,
            )
        )
        return
    if args.part:
        # The broker is loaded in every part, so the differences are the loops alone.
        if args.part == "flowkit":
            asyncio.run(with_flowkit(data, args.store or "memory"))
        else:
            asyncio.run(loaded_broker(data))
            if args.part == "hand":
                hand_written(data)
        return
    _, expected = hand_written(data)
    print(
        f"{args.clicks:,} clicks of {args.users:,} users, {len(expected):,} windows "
        f"(size {SIZE_MS // 1000} s, grace {GRACE_MS // 1000} s)"
    )
    others: list[tuple[str, Any]] = []
    between: list[tuple[str, str, str]] = []
    if args.rocksdb:
        others = [("flowkit on rocksdb", lambda: asyncio.run(with_flowkit(data, "rocksdb")))]
        between = [("rocksdb / memory", "flowkit on rocksdb", "flowkit")]
    against_hand_written(
        args.repeat,
        len(data),
        "record",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data)),
        "flowkit's windows differ from the hand-written loop's",
        others,
        between,
    )
    print("windows: identical to the hand-written loop's in every round")


if __name__ == "__main__":
    main()
