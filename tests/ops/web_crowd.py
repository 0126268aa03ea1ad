"""A crowd of HTTP clients for the flood tests: ``python -m tests.ops.web_crowd PORT
CLIENTS SECONDS`` keeps ``CLIENTS`` connections to 127.0.0.1:``PORT`` for ``SECONDS``,
each asking ``/status`` and connecting again as soon as it has its answer (or its
connection broke). It prints ``up`` once its clients knock, then how many answers it got."""

from __future__ import annotations

import asyncio
import resource
import sys
import time

REQUEST = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


async def client(port: int, stop: float, counts: list[int]) -> None:
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)  # not listening (yet, or any more)
            continue
        try:
            writer.write(REQUEST)
            counts[0 if (await reader.read()).startswith(b"HTTP/1.1 ") else 1] += 1
        except OSError:
            counts[1] += 1
        finally:
            writer.close()


async def crowd(port: int, clients: int, seconds: float) -> list[int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, clients + 100)), hard))
    stop = time.monotonic() + seconds
    counts = [0, 0]  # answers, broken connections
    tasks = [asyncio.create_task(client(port, stop, counts)) for _ in range(clients)]
    await asyncio.sleep(0)
    print("up", flush=True)
    await asyncio.gather(*tasks)
    return counts


if __name__ == "__main__":
    port, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    answered, broken = asyncio.run(crowd(port, clients, seconds))
    print(f"answered {answered} broken {broken}", flush=True)
