"""The web endpoint of a group of worker processes, served by the parent.

``flowkit worker APP --processes 2 --web-port 9100``: the parent listens on the address
given; each child serves its own endpoint on a private port of 127.0.0.1 (listed in
``/ready``). The parent answers:

- ``/metrics`` every process's metrics as one (see ``processes.metrics``);
- ``/ready`` 200 when every process runs and answers its own ``/ready`` with 200 (joined
  its group, holds its tables' state), else 503; the body lists each process;
- ``/health`` 200 while the parent runs and has not given up, else 503;
- ``/tables...`` passed on to a running child, which finds the process that holds a key.
  The parent follows no redirect but one: a child's ``307`` to another child of this
  group is asked of that child; any other redirect is answered as it is, never fetched.

The parent serves as a worker's endpoint does (``web.serving``: the same token, Host
allow-list and limits), behind the group's one web gate (``web.gate``): the
children, which only the parent asks, accept in their own event loops. They get the token
over a pipe (``processes``), and the parent sends it with what it asks them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ...errors import ConfigurationError
from ..web.access import WebToken
from ..web.limits import WebLimits
from ..web.serving import ServedEndpoint
from .group import Child, ProcessGroup
from .metrics import GroupCollector

__all__ = ["GroupWebServer"]

_ASK_TIMEOUT = 2.0  # seconds a child has to answer the parent
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class GroupWebServer(ServedEndpoint):
    """Serves a process group's metrics, readiness and health over HTTP."""

    def __init__(
        self,
        group: ProcessGroup,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: WebToken | str | None = None,
        allowed_hosts: list[str] | None = None,
        limits: WebLimits | None = None,
    ) -> None:
        self.group = group
        # Its readiness asks the children, in this loop: only /health is the gate's.
        super().__init__(
            host,
            port,
            self._probe,
            token=token,
            allowed_hosts=allowed_hosts,
            limits=limits,
            gate_probes=frozenset({"/health"}),
        )
        self.collector = GroupCollector(group)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._session: aiohttp.ClientSession | None = None

    def application(self) -> web.Application:
        """The aiohttp application (routes only; ``start`` serves it)."""
        app = self.new_application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/health", self._health)
        app.router.add_get("/tables{tail:.*}", self._tables)
        return app

    async def start(self) -> None:
        """Listen; a port in use or a host not of this machine is a ``ConfigurationError``."""
        token = self.access.token
        # The children want the token too (aiohttp drops it on a redirect to another origin).
        self._session = aiohttp.ClientSession(headers=token.header() if token else None)
        try:
            await self.serve(self.application())
        except ConfigurationError:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop listening. Idempotent."""
        await self.stop_serving()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the server is not started"
        return self._session

    # -- routes ---------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        await self.collector.refresh(self.session)
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _ready(self, request: web.Request) -> web.Response:
        states = await asyncio.gather(*(self._child_ready(c) for c in self.group.children))
        ready = all(state["ready"] for state in states) and not self.group.stopping
        body = {"ready": ready, "processes": states}
        return web.json_response(body, status=200 if ready else 503)

    async def _child_ready(self, child: Child) -> dict[str, Any]:
        url = child.url()
        ready = False
        if url is not None:
            try:
                timeout = aiohttp.ClientTimeout(total=_ASK_TIMEOUT)
                async with self.session.get(url + "/ready", timeout=timeout) as response:
                    ready = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                pass
        return {"process": child.index, "pid": child.pid, "url": url, "ready": ready}

    async def _health(self, request: web.Request) -> web.Response:
        status, body = self._probe("/health")
        return web.Response(body=body, status=status, content_type="application/json")

    def _probe(self, path: str) -> tuple[int, bytes]:
        """``/health``, also for connections past the limit; readiness asks the children,
        which takes time: past the limit, ``/ready`` is 503."""
        group = self.group
        if path != "/health":
            return 503, b'{"ready": false, "error": "busy: too many connections"}'
        alive = group.failed is None
        running = sum(child.pid is not None for child in group.children)
        body: dict[str, Any] = {"alive": alive, "processes": len(group.children)}
        body["running"] = running
        if group.failed is not None:
            body["error"] = group.failed
        return (200 if alive else 503), json.dumps(body).encode()

    async def _tables(self, request: web.Request) -> web.Response:
        for child in self.group.children:
            url = child.url()
            if url is None:
                continue
            try:
                return await self._ask(url + request.path_qs, hops=1)
            except (aiohttp.ClientError, TimeoutError):
                continue  # that one is going away: ask the next
        return web.json_response({"error": "no worker process is serving yet"}, status=503)

    async def _ask(self, url: str, *, hops: int) -> web.Response:
        """A child's answer to a table read; its redirect to another child of this group is
        asked of that child (``hops`` times at most), any other is answered as it is."""
        timeout = aiohttp.ClientTimeout(total=_ASK_TIMEOUT)
        async with self.session.get(url, timeout=timeout, allow_redirects=False) as response:
            location = response.headers.get("Location")
            if response.status in _REDIRECTS and location is not None:
                target = self._child_target(location)
                if target is not None and hops > 0:
                    return await self._ask(target, hops=hops - 1)
                return web.Response(status=response.status, headers={"Location": location})
            return web.Response(
                body=await response.read(),
                status=response.status,
                content_type=response.content_type,
            )

    def _child_target(self, location: str) -> str | None:
        """``location`` if it is a table read at a running child of this group, else None."""
        try:
            target = urlsplit(location)
        except ValueError:
            return None
        if not target.path.startswith("/tables/"):
            return None
        origin = f"{target.scheme}://{target.netloc}"
        return location if origin in {child.url() for child in self.group.children} else None
