"""The web endpoint's own CPU under an HTTP flood: an idle worker's and its gate's.

    python -m benchmarks.probes.web_endpoint [--clients 2000] [--seconds 10] [--repeat 3]

The YSB app's worker on the memory broker, with nothing to read, serves its web endpoint
(default limits) while the flooding process of ``benchmarks.web_flood`` keeps
``--clients`` connections to it (loopback, a session of its own). Over ``--seconds`` of
the flood each round prints the share of a core that the worker's process and its gate
(``flowkit.runtime.web.gate``) took, read from ``/proc`` (Linux), and what the crowd got:
answers 200, other answers (``503`` past the limit) and connections that ended in an error
(reset). ``--clients 0`` leaves only the flood's ``/health`` prober: the idle endpoint.

``web_flood`` compares records/s with and without the flood, and the noise of a shared
machine moves those by more than the endpoint costs; here nothing but the endpoint runs
in the worker, so its share is read directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.web_flood import _free_port, served_worker
from benchmarks.ysb import loaded_broker, payloads
from flowkit.logs import configure_logging

_TICK = os.sysconf("SC_CLK_TCK")
_WARM_UP = 3.0  # seconds of flood before the measure: the crowd is connecting


def _cpu(pid: int) -> float:
    """CPU seconds so far of process ``pid`` (user and system)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children() -> set[int]:
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found |= {int(pid) for pid in f.read().split()}
    return found


async def measure(port: int, flooder: int, seconds: float) -> tuple[float, float]:
    """The worker's and its gate's share of a core over ``seconds`` of the flood."""
    broker = await loaded_broker(payloads(10))
    worker = served_worker(broker, port)
    async with worker:
        await asyncio.sleep(_WARM_UP)
        gates = _children() - {flooder}
        gate_cpu, cpu, start = sum(map(_cpu, gates)), time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        gate_cpu = sum(map(_cpu, gates)) - gate_cpu
    return cpu / elapsed, gate_cpu / elapsed


def one_round(clients: int, seconds: float) -> dict[str, float]:
    """``measure`` under a flood of ``clients``, and what the crowd got."""
    port = _free_port()
    command = [sys.executable, "-m", "benchmarks.web_flood", "--flood", str(port)]
    command += ["--clients", str(clients), "--max-seconds", str(seconds + _WARM_UP + 3)]
    flooder = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert flooder.stdout is not None
        assert flooder.stdout.readline() == b"up\n"
        worker, gate = asyncio.run(measure(port, flooder.pid, seconds))
        out, _ = flooder.communicate(timeout=seconds + 60)
    finally:
        if flooder.poll() is None:
            flooder.kill()
            flooder.wait()
    crowd = json.loads(out.splitlines()[-1])
    return {
        "worker": worker,
        "gate": gate,
        "ok": crowd["ok"],
        "refused": crowd["refused"],
        "errors": crowd["errors"],
        "flood_cpu": crowd["cpu"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="the web endpoint's CPU under a flood")
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    configure_logging("warning")
    print(f"an idle YSB worker's web endpoint; flood: {args.clients} clients, {args.seconds:g} s")
    rounds = []
    for i in range(args.repeat):
        r = one_round(args.clients, args.seconds)
        rounds.append(r)
        print(
            f"round {i + 1}: worker {r['worker']:.1%} of a core, gate {r['gate']:.1%}; the "
            f"crowd got {r['ok']:.0f} 200, {r['refused']:.0f} other answers, "
            f"{r['errors']:.0f} broken connections (its process: {r['flood_cpu']:.1f} CPU s "
            "in all)"
        )
    worker = statistics.median(r["worker"] for r in rounds)
    gate = statistics.median(r["gate"] for r in rounds)
    print(f"median: worker {worker:.1%} of a core, gate {gate:.1%}, both {worker + gate:.1%}")


if __name__ == "__main__":
    main()
