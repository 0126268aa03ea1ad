"""An HTTP flood: YSB with 2,000 clients on the web endpoint versus the same worker quiet.

    python -m benchmarks.web_flood [--events 10000000] [--clients 2000] [--repeat 5]

Each round runs the YSB app (``examples/ysb.py``) over the same events on the memory
broker twice, with the web endpoint on (``flowkit.runtime.web.server``, default limits): once
quiet, once while another process keeps ``--clients`` connections to it (loopback only),
each asking ``/metrics``, ``/status`` and ``/`` again as soon as it has an answer, and
connecting again at once when refused. A thread of that process (blocking sockets, so
the clients' busy event loop does not delay it) asks ``/health`` on a fresh connection
every 100 ms and times the answers. Printed: records/s quiet and flooded,
their ratio (the goal: at least 0.80), the same per CPU second of the worker's process
and per CPU second of it and its web gate (``flowkit.runtime.web.gate``), the share of
a core the endpoint took (worker and gate, beyond the records' own CPU), the CPU the
flooding process took, and the ``/health`` latencies. The flooding process runs in a
session of its own, as a crowd on other machines would. The flood lasts
the flooded run (it is told when that ends), ``--max-seconds`` at most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import flowkit
from benchmarks.ysb import START_MS, loaded_broker, payloads
from examples import ysb
from flowkit.logs import configure_logging
from flowkit.testing import FakeClock
from flowkit.transports import MemoryBroker, MemoryTransport

PATHS = (b"/metrics", b"/status", b"/")
CPU_RATES: list[float] = []  # records per CPU second of the worker's process
GATE_RATES: list[float] = []  # records per CPU second of the worker and its gate


async def _client(port: int, stop: list[float], counts: list[int]) -> None:
    n = 0
    while time.monotonic() < stop[0]:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)  # not listening yet
            continue
        try:
            while time.monotonic() < stop[0]:
                path = PATHS[n % len(PATHS)]
                n += 1
                writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                counts[0 if head.startswith(b"HTTP/1.1 200") else 1] += 1
                if b"Connection: close" in head:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            counts[2] += 1
        finally:
            writer.close()


def _probe_thread(
    port: int, stop: list[float], latencies: list[float], failures: list[str]
) -> None:
    # A thread of its own, with blocking sockets: the 2,000 clients' event loop is busy,
    # and its delays are not the worker's.
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    while time.monotonic() < stop[0]:
        begin = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(request)
                answer = b""
                while chunk := conn.recv(4096):
                    answer += chunk
            if answer.startswith(b"HTTP/1.1 200"):
                latencies.append(time.perf_counter() - begin)
            else:
                failures.append(repr(answer[:12]))
        except ConnectionRefusedError:
            pass  # the worker does not listen (yet, or any more): not a probe of it
        except OSError as exc:
            failures.append(type(exc).__name__)
        time.sleep(0.1)


async def flood(port: int, clients: int, seconds: float) -> dict[str, object]:
    """The flooding side (its own process): ``clients`` connections for ``seconds``, or
    until it gets ``SIGUSR1`` (the flooded run is over)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, clients + 200)), hard))
    stop = [time.monotonic() + seconds]
    ended = asyncio.Event()

    def end() -> None:
        stop[0] = 0.0
        ended.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, end)
    counts = [0, 0, 0]  # 200s, other answers, connections that ended in an error
    latencies: list[float] = []
    failures: list[str] = []
    tasks = [asyncio.create_task(_client(port, stop, counts)) for _ in range(clients)]
    prober = threading.Thread(target=_probe_thread, args=(port, stop, latencies, failures))
    prober.start()
    print("up", flush=True)  # the clients knock; the worker may start
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ended.wait(), seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.to_thread(prober.join)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"ok": counts[0], "refused": counts[1], "errors": counts[2], "health": latencies,
            "health_failed": failures, "cpu": usage.ru_utime + usage.ru_stime}  # fmt: skip


async def run(
    data: list[tuple[bytes, bytes]], port: int, before: Callable[[], object] | None = None
) -> float:
    """Records per second over the whole input, the web endpoint on ``port``; ``before``
    is called once the broker holds the input, before the worker starts. Also the
    records per second of this process's CPU time (in ``CPU_RATES``): on a machine
    whose cores the flooding process and others share, that is the steadier figure; and
    of its CPU time and its web gate's (in ``GATE_RATES``; the gate, a child process, is
    waited for when the worker closes, before the flooding process)."""
    broker = await loaded_broker(data)
    if before is not None:
        before()
    worker = served_worker(broker, port)
    children = _children_cpu()
    async with worker:
        start, cpu = time.perf_counter(), time.process_time()
        while worker.records_in < len(data) or not worker.is_idle():  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    CPU_RATES.append(len(data) / cpu)
    GATE_RATES.append(len(data) / (cpu + _children_cpu() - children))
    return len(data) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description="records/s with and without an HTTP flood")
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--flood", type=int, help=argparse.SUPPRESS)  # the flooding process
    args = parser.parse_args()
    if args.flood is not None:
        result = asyncio.run(flood(args.flood, args.clients, args.max_seconds))
        print(json.dumps(result))
        return
    configure_logging("warning")
    data = payloads(args.events)
    print(f"{args.events:,} YSB events; flood: {args.clients} clients")
    ratios, cpu_ratios, gate_ratios, shares, latencies = [], [], [], [], []
    failed: list[str] = []
    for i in range(args.repeat):
        port = _free_port()
        gc.collect()
        quiet = asyncio.run(run(data, port))
        port = _free_port()
        command = [sys.executable, "-m", "benchmarks.web_flood", "--flood", str(port)]
        command += ["--clients", str(args.clients), "--max-seconds", str(args.max_seconds)]
        flooders: list[subprocess.Popen[bytes]] = []

        def start_flood(
            command: list[str] = command, flooders: list[subprocess.Popen[bytes]] = flooders
        ) -> None:
            # A session of its own: the crowd stands for other machines' clients. Linux
            # shares a loaded machine's CPU between sessions first (autogroup), and in
            # this one the flooding process's CPU would be taken from the worker's share.
            flooder = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
            flooders.append(flooder)
            assert flooder.stdout is not None
            assert flooder.stdout.readline() == b"up\n"
            time.sleep(0.5)  # its clients are knocking before the worker listens

        try:
            gc.collect()
            flooded = asyncio.run(run(data, port, start_flood))
            flooders[0].send_signal(signal.SIGUSR1)  # the flooded run is over
            out, _ = flooders[0].communicate(timeout=args.max_seconds + 30)
        finally:
            for flooder in flooders:
                if flooder.poll() is None:
                    flooder.kill()
                    flooder.wait()
        result = json.loads(out.splitlines()[-1])
        latencies += result["health"]
        failed += result["health_failed"]
        ratios.append(flooded / quiet)
        cpu_quiet, cpu_flooded = CPU_RATES[-2:]
        cpu_ratios.append(cpu_flooded / cpu_quiet)
        gate_quiet, gate_flooded = GATE_RATES[-2:]
        gate_ratios.append(gate_flooded / gate_quiet)
        # The CPU the endpoint took (worker and gate) beyond the records' own, per second
        # of the flood: a fraction of one core, whatever else the machine runs.
        web_cpu = args.events / gate_flooded - args.events / gate_quiet
        shares.append(web_cpu / (args.events / flooded))
        print(
            f"round {i + 1}: quiet {quiet:,.0f} records/s, flooded {flooded:,.0f} records/s "
            f"({flooded / quiet:.2f}); per CPU second {cpu_quiet:,.0f} and "
            f"{cpu_flooded:,.0f} ({cpu_flooded / cpu_quiet:.2f}), with the gate's "
            f"{gate_quiet:,.0f} and {gate_flooded:,.0f} ({gate_flooded / gate_quiet:.2f}); "
            f"the endpoint took {shares[-1]:.1%} of a core; "
            f"flood answers: {result['ok']} 200, {result['refused']} other, "
            f"{result['errors']} broken connections; the flood took {result['cpu']:.1f} "
            "CPU seconds"
        )
    print(
        f"flooded / quiet records/s: median {statistics.median(ratios):.2f} (goal >= 0.80); "
        f"per CPU second of the worker: median {statistics.median(cpu_ratios):.2f}, "
        f"of the worker and its gate: median {statistics.median(gate_ratios):.2f}"
    )
    share = statistics.median(shares)
    print(
        f"the endpoint (worker and gate) took {share:.1%} of a core while flooded (median): "
        f"a worker with a core of its own keeps about {1 - share:.2f} of its records/s"
    )
    if latencies:
        ms = sorted(x * 1000 for x in latencies)
        print(
            f"/health during the floods: {len(ms)} answered, {len(failed)} failed "
            f"{sorted(failed)}; median "
            f"{statistics.median(ms):.1f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.1f} ms, "
            f"max {ms[-1]:.1f} ms"
        )


def served_worker(broker: MemoryBroker, port: int) -> flowkit.Worker:
    """The YSB worker with its web endpoint on ``port``, over ``broker``'s events (an hour
    past their start: every window closes as it comes)."""
    return flowkit.Worker(
        ysb.make_app(generate=False, on_close=None),
        transport=MemoryTransport(broker),
        clock=FakeClock(START_MS / 1000 + 3600),
        web_port=port,
        status_interval=None,
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
