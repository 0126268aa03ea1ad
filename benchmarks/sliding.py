"""Sliding windows: flowkit against a hand-written loop, same data, same process.

    python -m benchmarks.sliding [--clicks 200000] [--repeat 5]

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
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import heapq
import random
import time
from operator import itemgetter

import msgspec

import flowkit
from benchmarks.rounds import against_hand_written
from benchmarks.ysb import Seconds
from flowkit.logs import configure_logging
from flowkit.partitioning import partition_for_key
from flowkit.transports import MemoryBroker, MemoryTransport

START_MS = 1_700_000_000_000
PARTITIONS = 4
USERS = 5000
SIZE_MS, GRACE_MS = 60_000, 10_000
Data = list[tuple[int, bytes, bytes, int]]  # (partition, key, value, timestamp)
Result = list[tuple[str, int, int, int]]  # (user, start, end, clicks), sorted


class Click(msgspec.Struct):
    user: str
    t: int


def data_set(n: int) -> Data:
    rng = random.Random(7)
    enc = msgspec.json.Encoder()
    users = [f"user-{i}" for i in range(USERS)]
    weights = [1.0 / (1 + i % 50) for i in range(USERS)]  # some users click far more
    out: Data = []
    for i, user in enumerate(rng.choices(users, weights, k=n)):
        ts = START_MS + i * 10 - rng.randrange(200)
        key = user.encode()
        out.append((partition_for_key(key, PARTITIONS), key, enc.encode(Click(user, ts)), ts))
    end = START_MS + n * 10 + 3_600_000
    for p in range(PARTITIONS):  # far ahead: every window closes
        out.append((p, b"", enc.encode(Click("", end)), end))
    return out


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


def make_app(closed: Result) -> flowkit.App:
    app = flowkit.App("slidingbench", partitions=PARTITIONS)
    clicks: flowkit.Topic[Click] = app.topic("clicks", value_type=Click)

    def on_close(user: str, window: flowkit.Window, count: int) -> None:
        closed.append((user, window.start, window.end, count))

    recent = app.table("recent", default=int).sliding(
        SIZE_MS / 1000,
        grace=GRACE_MS / 1000,
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


async def loaded_broker(data: Data) -> MemoryBroker:
    broker = MemoryBroker(retention_records=None)
    broker.create_topic("clicks", PARTITIONS)
    producer = MemoryTransport(broker).producer()
    for p, key, raw, ts in data:
        await producer.send("clicks", raw, key=key, partition=p, timestamp_ms=ts)
    return broker


async def with_flowkit(data: Data) -> tuple[Seconds, Result, Seconds]:
    broker = await loaded_broker(data)
    closed: Result = []
    app = make_app(closed)
    start, cpu = time.perf_counter(), time.process_time()
    worker = flowkit.Worker(app, transport=MemoryTransport(broker))
    async with worker:
        # Polling the worker is the point: it says when every record is processed.
        while worker.records_in < len(data) or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    elapsed = Seconds(time.perf_counter() - start, time.process_time() - cpu)
    return elapsed, sorted(closed), hand_written_over_logs(broker)


def main() -> None:
    parser = argparse.ArgumentParser(description="Sliding windows: flowkit vs by hand")
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    configure_logging("warning")
    data = data_set(args.clicks)
    _, expected = hand_written(data)
    print(
        f"{args.clicks:,} clicks of {USERS:,} users, {len(expected):,} windows "
        f"(size {SIZE_MS // 1000} s, grace {GRACE_MS // 1000} s)"
    )
    against_hand_written(
        args.repeat,
        len(data),
        "record",
        lambda: hand_written(data),
        lambda: asyncio.run(with_flowkit(data)),
        "flowkit's windows differ from the hand-written loop's",
    )
    print("windows: identical to the hand-written loop's in every round")


if __name__ == "__main__":
    main()
