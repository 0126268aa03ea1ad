"""A small HTTP endpoint for a running worker: ``/metrics``, ``/ready``, ``/graph``.

``flowkit worker APP --web-port 9100`` serves it on 127.0.0.1 (``--web-host`` to change).
Prometheus scrapes ``/metrics``; a supervisor or Kubernetes probes ``/ready`` (200 once
the worker has joined its group and recovered its tables, 503 before); ``/graph`` is the
app's graph as JSON. Plain asyncio: no web framework for three GET routes.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["WebServer"]


class WebServer:
    """Serves a worker's metrics, readiness and graph over HTTP/1.1 (GET only)."""

    def __init__(self, worker: Worker, host: str = "127.0.0.1", port: int = 0) -> None:
        self.worker = worker
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; with port 0 the actual port is in ``self.port`` afterwards."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        """Stop listening. Idempotent."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            status, ctype, body = self._route(method, path.split("?", 1)[0])
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, ConnectionError):
            pass
        finally:
            writer.close()

    def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.worker.metrics.registry)
        if path == "/ready":
            ready = self.worker.ready
            body = json.dumps({"ready": ready, "app": self.worker.app.name}).encode()
            return ("200 OK" if ready else "503 Service Unavailable"), "application/json", body
        if path == "/graph":
            body = json.dumps(self.worker.app.graph().to_dict(), indent=2).encode()
            return "200 OK", "application/json", body
        return "404 Not Found", "text/plain", b"try /metrics, /ready or /graph\n"
