"""Session windows: flowkit against a hand-written loop, same data, same process.

    python -m benchmarks.sessions [--clicks 200000] [--repeat 5] [--store both]
    python -m benchmarks.sessions --instructions --clicks 20000    # callgrind counts
    python -m benchmarks.sessions --rss --users 200000 --expires 3600   # each store's RSS

The data: N clicks of 5,000 users, keyed by user on 4 partitions, one every 10 ms of
event time with up to 200 ms of disorder, so a user clicks every 50 s on average, in
bursts; then one click far ahead per partition, which closes every session. The query
counts clicks per user session, with a gap of 60 s and a grace of 10 s (Kafka Streams'
``SessionWindows``): a user's clicks closer than 60 s form one session, a click that
bridges two sessions merges them, and each session's count comes out once, when it closes.

* hand-written: each partition's records in order, decoded with msgspec; per partition a
  dict of each user's sessions ``[start, end, count]`` and a heap of session ends; stream
  time, late records, merges, and a session emitted once stream time passes its end plus
  gap plus grace. The same semantics, written for this data (one partition per key, one
  process);
* flowkit: ``table.session(60.0, grace=10.0, combine=operator.add)`` with ``on_close``,
  run by a worker over the topic pre-loaded on the memory broker (two phases, changelog
  included), timed until every record is processed and the worker has stopped; its
  sessions are compared with the hand-written loop's.

``--store`` chooses the table's store: ``memory`` (the default), ``rocksdb`` (the
``rocksdb`` extra; a fresh data directory each round), or ``both``, in the same paired
rounds with their ratio. ``--rss`` runs flowkit once per store, each in a process of its
own, and prints how much its peak RSS grew over the broker loaded with the data (the
changelog's records dropped as they are written; the repartition topic's kept);
``--users`` and ``--expires`` (how long closed sessions stay readable) set how much state
there is.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import operator
import time
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

GAP_MS, GRACE_MS = 60_000, 10_000


def sessions(records: list[tuple[bytes, int]]) -> Result:
    """The hand-written session count over one partition's (value, timestamp) records."""
    decode = msgspec.json.Decoder(Click).decode
    gap, grace = GAP_MS, GRACE_MS
    by_user: dict[str, list[list[Any]]] = {}
    ends: list[tuple[int, int, str, int]] = []  # (end, n, user, start): a lazy heap
    out: Result = []
    now = -(2**62)
    n = 0
    for raw, _ in records:
        click = decode(raw)
        ts = click.t
        if ts > now:
            now = ts
            close = now - grace - gap
            while ends and ends[0][0] < close:
                _, _, user, start = heapq.heappop(ends)
                own = by_user.get(user)
                if not own:
                    continue
                for k, s in enumerate(own):
                    if s[0] == start:
                        if s[1] >= close:
                            n += 1
                            heapq.heappush(ends, (s[1], n, user, start))
                        else:
                            out.append((user, s[0], s[1], s[2]))
                            del own[k]
                            if not own:
                                del by_user[user]
                        break
        if not click.user:
            continue
        user = click.user
        own = by_user.get(user)
        if own is None:
            if ts < now - grace - gap:
                continue  # late
            by_user[user] = [[ts, ts, 1]]
            n += 1
            heapq.heappush(ends, (ts, n, user, ts))
            continue
        hit = [s for s in own if s[0] - gap <= ts <= s[1] + gap]
        if not hit:
            if ts < now - grace - gap:
                continue  # late
            own.append([ts, ts, 1])
            own.sort()
            n += 1
            heapq.heappush(ends, (ts, n, user, ts))
            continue
        merged = [min(ts, hit[0][0]), max(ts, hit[-1][1]), sum(s[2] for s in hit) + 1]
        if merged[0] != hit[0][0]:
            n += 1
            heapq.heappush(ends, (merged[1], n, user, merged[0]))
        own[own.index(hit[0]) : own.index(hit[-1]) + 1] = [merged]
    return out


def hand_written(data: Data) -> tuple[Seconds, Result]:
    start, cpu = time.perf_counter(), time.process_time()
    parts: list[list[tuple[bytes, int]]] = [[] for _ in range(PARTITIONS)]
    for p, _, raw, ts in data:
        parts[p].append((raw, ts))
    out: Result = []
    for records in parts:
        out.extend(sessions(records))
    return Seconds(time.perf_counter() - start, time.process_time() - cpu), sorted(out)


def hand_written_over_logs(broker: MemoryBroker) -> Seconds:
    start, cpu = time.perf_counter(), time.process_time()
    for p in range(PARTITIONS):
        sessions([(m.value, m.timestamp) for m in broker.messages("clicks", p) if m.value])
    return Seconds(time.perf_counter() - start, time.process_time() - cpu)


def make_app(
    closed: Result, data_dir: Path | None = None, expires: float | None = None
) -> flowkit.App:
    """The query; with ``data_dir``, its table on ``rocksdb://`` there."""
    on_disk: dict[str, Any] = (
        {} if data_dir is None else {"store": "rocksdb://", "data_dir": data_dir}
    )
    app = flowkit.App("sessionbench", partitions=PARTITIONS, **on_disk)
    clicks: flowkit.Topic[Click] = app.topic("clicks", value_type=Click)

    def on_close(user: str, window: flowkit.Window, count: int) -> None:
        closed.append((user, window.start, window.end, count))

    visits = app.table("visits", default=int).session(
        GAP_MS / 1000,
        grace=GRACE_MS / 1000,
        expires=expires,
        combine=operator.add,
        time=lambda c: c.t,
        on_close=on_close,
        late="drop",
    )

    @app.agent(clicks)
    async def count(stream: flowkit.Stream[Click]) -> None:
        async for click in stream:
            if click.user:
                visits.add(click.user, 1, click.t)

    return app


async def with_flowkit(
    data: Data, store: str = "memory", expires: float | None = None
) -> tuple[Seconds, Result, Seconds]:
    elapsed, closed, broker = await run_on(data, make_app, store, expires)
    return elapsed, closed, hand_written_over_logs(broker)


def main() -> None:
    parser = argparse.ArgumentParser(description="Session windows: flowkit vs by hand")
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", choices=["memory", "rocksdb", "both"], default="memory")
    parser.add_argument("--expires", type=float, default=None, help="seconds (the default's)")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare instruction counts under valgrind (use --clicks 20000)",
    )
    parser.add_argument("--rss", action="store_true", help="each store's peak RSS growth")
    parser.add_argument(
        "--part", choices=["setup", "hand", "flowkit", "rss"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    configure_logging("warning")
    if args.instructions:
        compare("benchmarks.sessions", "--clicks", args.clicks, "click")
        return
    if args.rss:
        print(f"{args.clicks:,} clicks of {args.users:,} users, expires {args.expires} s")
        rss_pair("benchmarks.sessions", args, "sessions")
        return
    data = data_set(args.clicks, args.users)
    if args.part == "rss":
        asyncio.run(
            rss_of(data, make_app, "sessionbench-visits-changelog", args.store, args.expires)
        )
        return
    if args.part:
        # The broker is loaded in every part, so the differences are the loops alone.
        if args.part == "flowkit":
            asyncio.run(with_flowkit(data, args.store, args.expires))
        else:
            asyncio.run(loaded_broker(data))
            if args.part == "hand":
                hand_written(data)
        return
    _, expected = hand_written(data)
    print(
        f"{args.clicks:,} clicks of {args.users:,} users, {len(expected):,} sessions "
        f"(gap {GAP_MS // 1000} s, grace {GRACE_MS // 1000} s), store {args.store}"
    )
    first = "rocksdb" if args.store == "rocksdb" else "memory"
    others = []
    between = []
    if args.store == "both":
        others = [
            ("flowkit on rocksdb", lambda: asyncio.run(with_flowkit(data, "rocksdb", args.expires)))
        ]
        between = [("rocksdb / memory", "flowkit on rocksdb", "flowkit")]
    against_hand_written(
        args.repeat,
        len(data),
        "record",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data, first, args.expires)),
        "flowkit's sessions differ from the hand-written loop's",
        others,
        between,
    )
    print("sessions: identical to the hand-written loop's in every round")


if __name__ == "__main__":
    main()
