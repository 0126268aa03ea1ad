"""What each step of the per-record path costs, in instructions (callgrind).

    python -m benchmarks.probes.steps [--records 20000]     # 14 runs under callgrind, 3 at a time

Every part runs the same setup (YSB events encoded; as ``Message`` objects for the loops,
loaded into a memory broker for the workers) and then one variant over the records;
callgrind counts each run's instructions and the setup's are subtracted, so each line is
that variant's own instructions per record. Variants:

* decode: msgspec into the 3-field projection (``AdView``) from bytes, from the broker's
  ``Message`` objects, into the full 7-field struct, and into a dict;
* filter: the projection decoded and tested inline (``if v.event_type == "view"``) or by
  a lambda (what ``stream.filter`` calls);
* async generator: every decoded record yielded by an async generator to an ``async for``
  (what the step from a stream to the agent is), without an event loop;
* worker: a flowkit worker whose agent only iterates (``async for v in stream: pass``)
  over the records loaded into a memory broker, at 10,000 and 100 records per fetch
  (4 partitions: batches of 2,500 and 25), and at a fifth of the records (its start and
  stop cancel out). The difference between the fetch sizes is the cost of a batch: fetch,
  dispatch, queue, done, commit bookkeeping;
* per-record worker: the same worker with a per-record agent (``per_record=True``, a
  function that returns None), which the stream loop calls without a generator step.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

import flowkit
from benchmarks.callgrind import count
from benchmarks.ysb import START_MS, loaded_broker, payloads
from examples import ysb
from flowkit.logs import configure_logging
from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker, MemoryTransport

LOOPS = ["decode-bytes", "decode-messages", "decode-full", "decode-dict"]
LOOPS += ["filter-inline", "filter-lambda", "async-generator"]
FETCHES = (10_000, 100)


def loops(part: str, raw: list[bytes], messages: list[flowkit.Message]) -> int:
    """Run one loop variant; returns a count so nothing is optimised away."""
    decode = msgspec.json.Decoder(ysb.AdView).decode
    n = 0
    if part == "decode-bytes":
        for data in raw:
            decode(data)
    elif part == "decode-messages":
        for m in messages:
            decode(m.value)  # type: ignore[arg-type]
    elif part == "decode-full":
        full = msgspec.json.Decoder(ysb.AdEvent).decode
        for m in messages:
            full(m.value)  # type: ignore[arg-type]
    elif part == "decode-dict":
        to_dict = msgspec.json.Decoder().decode
        for m in messages:
            to_dict(m.value)  # type: ignore[arg-type]
    elif part == "filter-inline":
        for m in messages:
            v = decode(m.value)  # type: ignore[arg-type]
            if v.event_type == "view":
                n += 1
    elif part == "filter-lambda":
        f = lambda v: v.event_type == "view"  # noqa: E731
        for m in messages:
            v = decode(m.value)  # type: ignore[arg-type]
            if f(v):
                n += 1
    elif part == "async-generator":

        async def values() -> AsyncIterator[Any]:
            for m in messages:
                yield decode(m.value)  # type: ignore[arg-type]

        async def agent() -> int:
            seen = 0
            async for _ in values():
                seen += 1
            return seen

        coro = agent()
        try:
            coro.send(None)  # nothing awaits for real: it runs to the end at once
        except StopIteration as done:
            n = done.value
    return n


async def worker(broker: MemoryBroker, n: int, max_fetch: int, per_record: bool = False) -> None:
    app = flowkit.App("steps", partitions=ysb.PARTITIONS)
    events = app.topic("ysb-events", value_type=ysb.AdView)

    if per_record:

        @app.agent(events, per_record=True)
        def each(v: ysb.AdView) -> None:
            return None

    else:

        @app.agent(events)
        async def read(stream: flowkit.Stream[ysb.AdView]) -> None:
            async for _ in stream:
                pass

    clock = FakeClock(START_MS / 1000)
    w = flowkit.Worker(
        app,
        transport=MemoryTransport(broker),
        clock=clock,
        max_fetch_records=max_fetch,
        status_interval=None,
    )
    async with w:
        # Rare polls: an idle wait costs no instructions, a poll does.
        while w.records_in < n or not w.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def setup_and_run(n: int, part: str) -> None:
    data = payloads(n)
    if part == "setup" or part in LOOPS:
        # The records as a broker holds them: a copy of each value in a Message.
        messages = [
            flowkit.Message("ysb-events", 0, i, START_MS, key, bytes(memoryview(raw)))
            for i, (key, raw) in enumerate(data)
        ]
        if part in LOOPS:
            loops(part, [raw for _, raw in data], messages)
        return
    broker = await loaded_broker(data)  # setup-worker, worker-N, record-N
    if part.startswith("worker-"):
        await worker(broker, n, int(part.split("-")[1]))
    elif part.startswith("record-"):
        await worker(broker, n, int(part.split("-")[1]), per_record=True)


def measure(n: int) -> None:
    small = n // 5
    jobs: dict[tuple[str, int], Any] = {}
    parts = [(p, n) for p in ["setup", *LOOPS, "setup-worker", *(f"worker-{f}" for f in FETCHES)]]
    parts += [("setup-worker", small), (f"worker-{FETCHES[0]}", small)]
    parts += [(f"record-{FETCHES[0]}", n)]
    with ThreadPoolExecutor(3) as pool:
        for part, size in parts:
            jobs[part, size] = pool.submit(
                count, "benchmarks.probes.steps", part, "--records", size
            )
    got = {key: job.result() for key, job in jobs.items()}
    setup = got["setup", n]
    print(f"{n:,} YSB events, instructions per record (callgrind)")
    for part in LOOPS:
        print(f"{part:<28}: {(got[part, n] - setup) / n:>8,.0f}")
    setup = got["setup-worker", n]
    for f in FETCHES:
        per = (got[f"worker-{f}", n] - setup) / n
        print(f"{'worker, ' + format(f, ',') + ' a fetch':<28}: {per:>8,.0f}   (whole run)")
    per = (got[f"record-{FETCHES[0]}", n] - setup) / n
    print(f"{'worker, per-record agent':<28}: {per:>8,.0f}   (whole run, 10,000 a fetch)")
    big = got[f"worker-{FETCHES[0]}", n] - setup
    little = got[f"worker-{FETCHES[0]}", small] - got["setup-worker", small]
    print(f"{'worker, steady state':<28}: {(big - little) / (n - small):>8,.0f}")
    # Batches per run: a fetch of f records is f / 4 records per partition batch.
    per_batch = (got[f"worker-{FETCHES[-1]}", n] - got[f"worker-{FETCHES[0]}", n]) / (
        n / (FETCHES[-1] / 4) - n / (FETCHES[0] / 4)
    )
    print(f"{'one batch (fetch to done)':<28}: {per_batch:>8,.0f}   per batch")


def main() -> None:
    parser = argparse.ArgumentParser(description="instructions per step of the record path")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--part", help="run one part (under callgrind)")
    args = parser.parse_args()
    configure_logging("warning")
    if args.part:
        asyncio.run(setup_and_run(args.records, args.part))
    else:
        measure(args.records)


if __name__ == "__main__":
    main()
