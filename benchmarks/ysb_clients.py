"""YSB over Kafka on both clients in one run: flowkit against the hand-written loop on each.

    python -m benchmarks.ysb_clients [--events 400000] [--repeat 3] [--max-records 2000]
                                     [--clients aiokafka,rdkafka]

Starts a Tansu broker (unless ``--bootstrap`` names a running Kafka), pre-loads the YSB
events once (as ``benchmarks.ysb_kafka`` does), then runs paired rounds. Each round times,
back to back on the same topic:

* the hand-written aiokafka loop (``getmany`` -> decode -> filter -> dict join -> count)
  and flowkit on aiokafka (``kafka://``);
* the hand-written confluent-kafka loop (blocking ``consume``, the same query) and flowkit
  on librdkafka (``kafka://...?client=rdkafka``).

All four use the same fetch settings (wait 50 ms, 4 MiB per partition fetch,
``fetch.queue.backoff.ms=10`` on librdkafka) and the same ``--max-records`` per fetch.
Every flowkit run uses a consumer group of its own and fresh internal topics; its emitted
window counts are checked against the hand-written loop's in every round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import uuid

import flowkit
from benchmarks import ysb_kafka as yk
from benchmarks.kafka_broker import kafka_broker
from benchmarks.rounds import report
from benchmarks.ysb import Seconds
from flowkit.logs import configure_logging

CLIENTS = ("aiokafka", "rdkafka")


def broker_url(bootstrap: str, client: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {**yk.GROUP_SETTINGS, "client": client}.items())
    return f"kafka://{bootstrap}?{query}"


async def with_flowkit(
    bootstrap: str, client: str, n: int, max_records: int, expected: int
) -> tuple[Seconds, yk.Counts]:
    """flowkit's YSB app on ``client``: seconds from its first record until every event is
    processed and nothing is in flight, and the window counts it emitted."""
    await yk.reset_internal_topics(bootstrap)
    worker = flowkit.Worker(
        yk.make_app(name=f"ysb-clients-{uuid.uuid4().hex[:8]}"),
        broker=broker_url(bootstrap, client),
        max_fetch_records=max_records,
    )
    async with worker:
        await yk._until(worker, lambda: worker.records_in > 0, 60)
        start, cpu = time.perf_counter(), time.process_time()
        await yk._until(worker, lambda: yk._done(worker, n), 600)
        elapsed = Seconds(time.perf_counter() - start, time.process_time() - cpu)
        counts = await yk.window_counts(bootstrap, expected)
    return elapsed, counts


async def hand_written(
    bootstrap: str, client: str, n: int, max_records: int
) -> tuple[Seconds, yk.Counts]:
    if client == "rdkafka":
        return yk._rd_loop(bootstrap, n, max_records, query=True)
    return await yk.hand_written(bootstrap, n, max_records)


async def run(
    bootstrap: str, events: int, repeat: int, max_records: int, clients: tuple[str, ...] = CLIENTS
) -> None:
    data = yk.payloads(events)
    size = sum(len(v) for _, v, _ in data) / len(data)
    rate = await yk.preload(bootstrap, data)
    del data
    gc.collect()
    print(
        f"{events:,} YSB events of {size:.0f} bytes in {yk.ysb.PARTITIONS} partitions "
        f"(produced at {rate:,.0f}/s); fetch {yk.FETCH}, max_records={max_records}"
    )
    rounds: list[dict[str, Seconds]] = []
    for _ in range(repeat):
        seconds: dict[str, Seconds] = {}
        for client in clients:
            gc.collect()
            t_hand, expected = await hand_written(bootstrap, client, events, max_records)
            gc.collect()
            t_flow, got = await with_flowkit(bootstrap, client, events, max_records, len(expected))
            if got != expected:
                raise SystemExit(f"{client}: flowkit's window counts differ from the loop's")
            seconds[f"{client} hand-written"] = t_hand
            seconds[f"{client} flowkit"] = t_flow
        rounds.append(seconds)
    ratios = [
        *((f"{c}: flowkit / hand-written", f"{c} flowkit", f"{c} hand-written") for c in clients),
    ]
    if len(clients) == len(CLIENTS):
        ratios += [
            ("hand-written rdkafka / aiokafka", "rdkafka hand-written", "aiokafka hand-written"),
            ("flowkit rdkafka / aiokafka", "rdkafka flowkit", "aiokafka flowkit"),
        ]
    report(rounds, events, "event", ratios)
    # CPU seconds of this process (librdkafka's and aiokafka's threads included) over the
    # same intervals: other processes on a shared machine move them far less.
    print("the same rounds in CPU time of the process:")
    report([{k: t.cpu for k, t in r.items()} for r in rounds], events, "event", ratios)
    print(
        f"window counts: identical to the hand-written loop's in every round ({', '.join(clients)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="YSB over Kafka, both clients, one run")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3, help="paired rounds")
    parser.add_argument("--max-records", type=int, default=2000, help="records per fetch")
    parser.add_argument("--bootstrap", help="host:port of a running Kafka (default: Tansu)")
    parser.add_argument(
        "--clients", default=",".join(CLIENTS), help="which clients to run (comma-separated)"
    )
    args = parser.parse_args()
    clients = tuple(args.clients.split(","))
    if not clients or not set(clients) <= set(CLIENTS):
        parser.error(f"--clients takes {', '.join(CLIENTS)}")
    configure_logging("warning")
    with kafka_broker(args.bootstrap) as (bootstrap, _):
        asyncio.run(run(bootstrap, args.events, args.repeat, args.max_records, clients))


if __name__ == "__main__":
    main()
