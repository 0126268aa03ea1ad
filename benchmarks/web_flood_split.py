"""Where a flooded worker's CPU goes: its endpoint's work, or the machine it shares.

    python -m benchmarks.web_flood_split [--events 2000000] [--clients 2000] [--repeat 3]

Each round runs the YSB worker of ``benchmarks.web_flood`` three times over the same
events, in turn: quiet; flooded (``--clients`` connections to its endpoint, the flood
of ``benchmarks.web_flood``); and beside a decoy (the same flood against a server of
another process, ``python -m http.server``, so that the machine is as busy but the
worker serves nothing). Printed per round and as medians (ranges): records per CPU
second of the worker's process in each run, flooded/quiet and decoy/quiet, and the
worker's voluntary and involuntary context switches (a loop woken often by its
endpoint would show voluntary ones). What decoy/quiet loses is the shared machine's
(caches, the other core); what flooded loses beyond it is the worker's own endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import signal
import statistics
import subprocess
import sys
import time

from benchmarks.web_flood import _free_port, served_worker
from benchmarks.ysb import loaded_broker, payloads
from flowkit.logs import configure_logging

MODES = ("quiet", "flooded", "decoy")


def _flood(port: int, clients: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "benchmarks.web_flood", "--flood", str(port)]
    command += ["--clients", str(clients), "--max-seconds", "120"]
    flooder = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
    assert flooder.stdout is not None
    assert flooder.stdout.readline() == b"up\n"
    time.sleep(0.5)  # its clients are knocking before the worker starts
    return flooder


def _neighbours(mode: str, port: int, clients: int) -> list[subprocess.Popen[bytes]]:
    """What runs beside the worker in ``mode``: the flood first (on the worker's ``port``,
    or on a decoy server's, which comes after it in the list)."""
    if mode == "flooded":
        return [_flood(port, clients)]
    if mode != "decoy":
        return []
    target = _free_port()
    command = [sys.executable, "-m", "http.server", str(target), "--bind", "127.0.0.1"]
    decoy = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    time.sleep(1.0)  # it listens
    return [_flood(target, clients), decoy]


async def _run(data: list[tuple[bytes, bytes]], mode: str, clients: int) -> tuple[float, int, int]:
    """Records per CPU second of this process, and its voluntary and involuntary context
    switches, over the whole input in ``mode``."""
    broker = await loaded_broker(data)
    port = _free_port()
    others = _neighbours(mode, port, clients)
    try:
        async with served_worker(broker, port) as worker:
            before, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            while worker.records_in < len(data) or not worker.is_idle():  # noqa: ASYNC110
                await asyncio.sleep(0.002)
            cpu = time.process_time() - cpu
            after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        _end(others)
    return len(data) / cpu, after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw


def _end(others: list[subprocess.Popen[bytes]]) -> None:
    if others:
        others[0].send_signal(signal.SIGUSR1)  # the flood ends
        others[0].communicate(timeout=150)
    for other in others[1:]:
        other.kill()
        other.wait()


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description="a flooded worker's CPU: endpoint or machine")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    configure_logging("warning")
    data = payloads(args.events)
    print(f"{args.events:,} YSB events; flood: {args.clients} clients; modes {', '.join(MODES)}")
    flooded, decoy = [], []
    for i in range(args.repeat):
        rates: dict[str, float] = {}
        for mode in MODES:
            gc.collect()
            rate, voluntary, involuntary = asyncio.run(_run(data, mode, args.clients))
            rates[mode] = rate
            print(
                f"round {i + 1} {mode}: {rate:,.0f} records per CPU second; context "
                f"switches {voluntary} voluntary, {involuntary} involuntary"
            )
        flooded.append(rates["flooded"] / rates["quiet"])
        decoy.append(rates["decoy"] / rates["quiet"])
    print(
        f"per CPU second of the worker, median (range): flooded/quiet {_spread(flooded)}, "
        f"decoy/quiet {_spread(decoy)}"
    )


if __name__ == "__main__":
    main()
