"""A running worker's HTTP endpoint, served by aiohttp in the worker's event loop.

``flowkit worker APP --web-port 9100`` serves it on 127.0.0.1 (``--web-host`` to change):

- ``/`` the live page of the app's dataflow graph (assets inside the package);
- ``/metrics`` Prometheus metrics; ``/status`` the page's figures as JSON;
- ``/health`` liveness: 200 while the event loop answers and no fatal error stopped the
  worker, else 503; ``/ready`` readiness: 200 once the worker joined its group and holds
  its tables' state, 503 before, during a rebalance and after a fatal error;
- ``/graph`` the app's graph as JSON;
- ``/tables`` and ``/tables/<name>/<key>`` live table reads (see ``web_tables``).
"""

from __future__ import annotations

import errno
import json
import socket
from importlib import resources
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..errors import ConfigurationError
from .web_status import status
from .web_tables import TableQueries

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["WebServer"]

log = structlog.get_logger(__name__)

_ASSETS = {
    "page.js": "text/javascript",
    "page.css": "text/css",
}


class WebServer:
    """Serves a worker's page, metrics, health, graph and tables over HTTP."""

    def __init__(self, worker: Worker, host: str = "127.0.0.1", port: int = 0) -> None:
        self.worker = worker
        self.host = host
        self.port = port
        self.tables = TableQueries(worker, self)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Where this endpoint answers (the port is known once started)."""
        return f"http://{self.host}:{self.port}"

    def application(self) -> web.Application:
        """The aiohttp application (routes only; ``start`` serves it)."""
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/assets/{name}", self._asset)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/graph", self._graph)
        app.router.add_get("/status", self._status)
        self.tables.add_routes(app)
        return app

    async def start(self) -> None:
        """Listen; with port 0 the actual port is in ``self.port`` afterwards. A host that
        is not this machine's or a port in use is a one-line ``ConfigurationError``."""
        runner = web.AppRunner(self.application(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigurationError(self._bind_error(exc)) from None
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        await self.tables.start()

    def _bind_error(self, exc: OSError) -> str:
        if exc.errno == errno.EADDRINUSE:
            return f"--web-port {self.port}: the port is already in use on {self.host}"
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            return f"--web-host {self.host!r}: not an address of this machine"
        if exc.errno == errno.EACCES:
            return f"--web-port {self.port}: not allowed to listen on it (ports < 1024 need root)"
        return f"--web-host {self.host!r} / --web-port {self.port}: cannot listen ({exc})"

    async def leaving(self) -> None:
        """The worker stops: withdraw its advertisement (best effort)."""
        await self.tables.aclose()
        try:
            await self.tables.advertise_gone()
        except Exception as exc:
            log.warning("withdrawing the web endpoint's advertisement failed", error=repr(exc))

    async def aclose(self) -> None:
        """Stop listening. Idempotent."""
        await self.tables.aclose()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # -- routes ---------------------------------------------------------------------------

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=_asset_text("page.html"), content_type="text/html")

    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _ASSETS:
            raise web.HTTPNotFound(text=f"no asset {name!r}\n")
        return web.Response(text=_asset_text(name), content_type=_ASSETS[name])

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.worker.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        error = self.worker.error
        body: dict[str, Any] = {"alive": error is None, "app": self.worker.app.name}
        if error is not None:
            body["error"] = str(error) or repr(error)
        return web.json_response(body, status=200 if error is None else 503)

    async def _ready(self, request: web.Request) -> web.Response:
        worker = self.worker
        ready = worker.ready and worker.error is None
        body = {"ready": ready, "app": worker.app.name}
        return web.json_response(body, status=200 if ready else 503)

    async def _graph(self, request: web.Request) -> web.Response:
        body = json.dumps(self.worker.app.graph().to_dict(), indent=2)
        return web.Response(text=body, content_type="application/json")

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(status(self.worker))


def _asset_text(name: str) -> str:
    return resources.files("flowkit.runtime").joinpath("webpage", name).read_text("utf-8")
