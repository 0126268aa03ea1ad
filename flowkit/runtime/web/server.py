"""A running worker's HTTP endpoint, served by aiohttp in the worker's event loop.

``flowkit worker APP --web-port 9100`` serves it on 127.0.0.1 (``--web-host`` to change):

- ``/`` the live page of the app's dataflow graph (assets inside the package);
- ``/metrics`` Prometheus metrics; ``/status`` the page's figures as JSON;
- ``/health`` liveness: 200 while the event loop answers and no fatal error stopped the
  worker, else 503; ``/ready`` readiness: 200 once the worker joined its group and holds
  its tables' state, 503 before, during a rebalance and after a fatal error;
- ``/graph`` the app's graph as JSON;
- ``/tables`` and ``/tables/<name>/<key>`` live table reads (see ``web.tables``).

It runs within ``WebLimits`` (``web.limits``: connections, header timeout, request rate)
and, when given, behind a token and a Host allow-list (``web.access``); aiohttp's and
asyncio's error reports become budgeted log lines meanwhile (``observe.server_logs``):
what every endpoint does to serve, in ``web.serving``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .access import WebToken
from .limits import WebLimits
from .serving import ServedEndpoint
from .status import status
from .tables import TableQueries

if TYPE_CHECKING:
    from ..worker import Worker

__all__ = ["WebServer"]

log = structlog.get_logger(__name__)

_ASSETS = {
    "page.js": "text/javascript",
    "page.css": "text/css",
}


class WebServer(ServedEndpoint):
    """Serves a worker's page, metrics, health, graph and tables over HTTP.

    ``token`` (a ``WebToken`` or its text) is then needed on every route but the probes;
    ``allowed_hosts`` extends (or, with ``*``, lifts) the Host allow-list; ``limits``
    bounds what the endpoint may take from the worker (``WebLimits``).
    """

    def __init__(
        self,
        worker: Worker,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: WebToken | str | None = None,
        allowed_hosts: list[str] | None = None,
        limits: WebLimits | None = None,
    ) -> None:
        self.worker = worker
        super().__init__(
            host, port, self.probe, token=token, allowed_hosts=allowed_hosts, limits=limits
        )
        self.access.page = self._page_response
        self.tables = TableQueries(worker, self)
        self._metrics_cache = _Cache(self.limits.cache_seconds)
        self._status_cache = _Cache(self.limits.cache_seconds)
        self._graph_body: bytes | None = None

    def __repr__(self) -> str:
        return f"WebServer({self.url}, {self.access!r})"

    def application(self) -> web.Application:
        """The aiohttp application (routes only; ``start`` serves it)."""
        app = self.new_application()
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
        await self.serve(self.application())
        await self.tables.start()

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
        await self.stop_serving()

    # -- routes ---------------------------------------------------------------------------

    def probe(self, path: str) -> tuple[int, bytes]:
        """``/health`` or ``/ready``: (status, JSON body). Also answers the connections
        past the limit, so an orchestrator sees a busy worker alive."""
        worker = self.worker
        body: dict[str, Any]
        if path == "/health":
            error = worker.error
            body = {"alive": error is None, "app": worker.app.name}
            if error is not None:
                body["error"] = str(error) or repr(error)
            ok = error is None
        else:
            ok = worker.ready and worker.error is None
            body = {"ready": ok, "app": worker.app.name}
        return (200 if ok else 503), json.dumps(body).encode()

    async def _health(self, request: web.Request) -> web.Response:
        status_code, body = self.probe("/health")
        return web.Response(body=body, status=status_code, content_type="application/json")

    async def _ready(self, request: web.Request) -> web.Response:
        status_code, body = self.probe("/ready")
        return web.Response(body=body, status=status_code, content_type="application/json")

    async def _page(self, request: web.Request) -> web.Response:
        return self._page_response(200, {})

    def _page_response(self, status_code: int, headers: dict[str, str]) -> web.Response:
        html, policy = _page()
        headers = {**headers, **_PAGE_HEADERS, "Content-Security-Policy": policy}
        return web.Response(
            body=html, status=status_code, content_type="text/html", headers=headers
        )

    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _ASSETS:
            raise web.HTTPNotFound(text=f"no asset {name!r}\n")
        return web.Response(text=_asset_text(name), content_type=_ASSETS[name])

    async def _metrics(self, request: web.Request) -> web.Response:
        registry = self.worker.metrics.registry
        body = self._metrics_cache.get(lambda: generate_latest(registry))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _graph(self, request: web.Request) -> web.Response:
        if self._graph_body is None:  # the app is frozen while its worker runs
            graph = self.worker.graph or self.worker.app.graph()  # (built at its start)
            self._graph_body = json.dumps(graph.to_dict(), indent=2).encode()
        return web.Response(body=self._graph_body, content_type="application/json")

    async def _status(self, request: web.Request) -> web.Response:
        body = self._status_cache.get(lambda: json.dumps(status(self.worker)).encode())
        return web.Response(body=body, content_type="application/json")


class _Cache:
    """One answer, reused for ``seconds`` (0: never)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = -float("inf")
        self._body = b""

    def get(self, make: Callable[[], bytes]) -> bytes:
        now = time.monotonic()
        if now - self._at >= self.seconds or not self.seconds:
            self._body, self._at = make(), now
        return self._body


# The page loads nothing but from this endpoint, and no other site may frame it.
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
_page_cache: tuple[bytes, str] | None = None


def _page() -> tuple[bytes, str]:
    """The page with its script and style inline (so it loads with no token: the script
    then sends it), and the content security policy that admits exactly those two."""
    global _page_cache
    if _page_cache is None:
        script, style = _asset_text("page.js"), _asset_text("page.css")
        html = (
            _asset_text("page.html")
            .replace('<link rel="stylesheet" href="/assets/page.css">', f"<style>{style}</style>")
            .replace('<script src="/assets/page.js"></script>', f"<script>{script}</script>")
        )
        policy = (
            "default-src 'none'; connect-src 'self'; img-src 'self' data:; "
            f"script-src {_digest(script)}; style-src {_digest(style)}; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
        )
        _page_cache = html.encode(), policy
    return _page_cache


def _digest(text: str) -> str:
    value = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return f"'sha256-{value}'"


def _asset_text(name: str) -> str:
    return resources.files("flowkit.runtime.web").joinpath("page", name).read_text("utf-8")
