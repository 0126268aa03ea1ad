"""What every flowkit HTTP endpoint does to serve: access, limits, gate and error logs.

A worker's endpoint (``web.server``) and a process group's, served by its parent
(``processes.web``), answer different routes alike: behind the same token and Host
allow-list (``web.access``), within the same ``WebLimits`` and gate (``web.limits``),
with aiohttp's and asyncio's error reports as budgeted log lines while they listen
(``observe.server_logs``), and no access log. ``ServedEndpoint`` holds that once; each
endpoint adds its routes and what it answers on the probes.
"""

from __future__ import annotations

import errno
import socket

from aiohttp import web
from aiohttp import web_app as _aiohttp_app

from ...errors import ConfigurationError
from ..observe.server_logs import ServerLogs
from .access import PROBES, WebAccess, WebToken
from .limits import BoundedListener, Probe, WebLimits

__all__ = ["ServedEndpoint"]


class ServedEndpoint:
    """An aiohttp endpoint on ``host``:``port`` (0: any free port, known once started).

    ``token`` (a ``WebToken`` or its text) is then needed on every route but the probes;
    ``allowed_hosts`` extends (or, with ``*``, lifts) the Host allow-list; ``limits``
    bounds what the endpoint may take from its process (``WebLimits``); ``probe`` answers
    ``/health`` and ``/ready``, also to the connections past the limit; its gate answers
    those of ``gate_probes`` itself, from what ``probe`` said last (``probes_changed``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        probe: Probe,
        *,
        token: WebToken | str | None = None,
        allowed_hosts: list[str] | None = None,
        limits: WebLimits | None = None,
        gate_probes: frozenset[str] = PROBES,
    ) -> None:
        self.host = host
        self.port = port
        self.access = WebAccess(host, token=token, allowed_hosts=allowed_hosts)
        self.limits = limits or WebLimits()
        self.listener = BoundedListener(
            self.limits, probe, gate=self.limits.gate, gate_probes=gate_probes
        )
        self._runner: web.AppRunner | None = None
        secrets = [self.access.token.reveal()] if self.access.token else []
        self._logs = ServerLogs(secrets)

    @property
    def url(self) -> str:
        """Where this endpoint answers (the port is known once started)."""
        return f"http://{self.host}:{self.port}"

    def new_application(self) -> web.Application:
        """An aiohttp application with no routes yet, behind the limits and the access
        checks, taking no request body past ``max_body``."""
        return web.Application(
            middlewares=[self.listener.middleware, self.access.middleware],
            client_max_size=self.limits.max_body,
        )

    async def serve(self, app: web.Application) -> None:
        """Listen and serve ``app``; with port 0 the actual port is in ``self.port``
        afterwards. Failing to listen is a one-line ``ConfigurationError`` (``bind_error``)."""
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, **self.listener.runner_options()
        )
        await runner.setup()
        try:
            port = await self.listener.start(runner, self.host, self.port)
        except OSError as exc:
            await runner.cleanup()
            raise ConfigurationError(self.bind_error(exc)) from None
        self._logs.install()
        self._runner = runner
        self.port = port

    def probes_changed(self) -> None:
        """What ``probe`` answers may have changed: the gate has the new answers before
        it answers another probe."""
        self.listener.probes_changed()

    def bind_error(self, exc: OSError) -> str:
        """The one line that says why the endpoint cannot listen, as the flags that chose
        its address say it (a worker's endpoint and a process group's alike)."""
        if exc.errno == errno.EADDRINUSE:
            return f"--web-port {self.port}: the port is already in use on {self.host}"
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            return f"--web-host {self.host!r}: not an address of this machine"
        if exc.errno == errno.EACCES:
            return f"--web-port {self.port}: not allowed to listen on it (ports < 1024 need root)"
        return f"--web-host {self.host!r} / --web-port {self.port}: cannot listen ({exc})"

    async def stop_serving(self) -> None:
        """Stop listening. Idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await self.listener.aclose()
            await runner.cleanup()
            self._logs.uninstall()
            _forget_middleware_chains()


def _forget_middleware_chains() -> None:
    # aiohttp keeps the middleware chain it built for each handler and application in a
    # module-wide cache (up to 1,024 of them), and so this endpoint's routes and the
    # worker behind them, long after it stopped: a process that starts a worker again
    # would keep every one. The cache is aiohttp's own; without it the chains are rebuilt.
    cache = getattr(_aiohttp_app, "_cached_build_middleware", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()
