"""Who may read a web endpoint: a bearer token, and the host names it answers to.

``WebAccess`` holds the two checks the worker's endpoint and a process group's parent
apply to every request, before any route runs:

- the ``Host`` header must name this endpoint (an allow-list): a web page the operator
  opens elsewhere cannot read a loopback endpoint by pointing its own domain name at
  127.0.0.1 (DNS rebinding). On a loopback address the list is on by default
  (``localhost``, ``127.0.0.1``, ``::1`` and the address itself); on any other address
  it is on once names are given; ``*`` turns it off. A foreign host is ``421``;
- with a token, every route but the probes (``/health``, ``/ready``) needs
  ``Authorization: Bearer <token>``, compared in constant time; else ``401``.

The token never leaves this object in clear: not in its repr, a log line or an error.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from .settings import TOKEN_VAR, WebToken

__all__ = ["PROBES", "TOKEN_VAR", "WebAccess", "WebToken", "host_name", "loopback"]

PROBES = frozenset({"/health", "/ready"})  # answered without the token: orchestrators' probes
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def loopback(host: str) -> bool:
    """True for a loopback address or ``localhost``."""
    if host.strip("[]").lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port, brackets or final dot, lowercased.

    >>> host_name("LocalHost:9100"), host_name("[::1]:9100"), host_name("example.com.")
    ('localhost', '::1', 'example.com')
    """
    value = header.strip().lower()
    if value.startswith("["):
        name = value[1 : value.find("]")] if "]" in value else value[1:]
    else:
        name, _, port = value.rpartition(":")
        if not name or not port.isdigit():
            name = value
    return name.rstrip(".")


class WebAccess:
    """The token and Host checks of one endpoint bound to ``bind_host``.

    ``allowed_hosts``: extra names the ``Host`` header may carry (``*``: any); None or
    empty keeps the default (the loopback names on a loopback bind, anything otherwise).
    """

    def __init__(
        self,
        bind_host: str,
        *,
        token: WebToken | str | None = None,
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:
        self.token = WebToken(token) if isinstance(token, str) else token
        names = {host_name(name) for name in allowed_hosts or () if name.strip()}
        self.allowed: frozenset[str] | None
        if "*" in names:
            self.allowed = None
        elif names or loopback(bind_host):
            self.allowed = frozenset(names | LOOPBACK_NAMES | {host_name(bind_host)})
        else:
            self.allowed = None  # any name: documented, and the token is what guards it
        # The live page (status, headers) -> response, served on a 401 too (see ``refused``).
        self.page: Callable[[int, dict[str, str]], web.Response] | None = None

    def __repr__(self) -> str:
        hosts = "*" if self.allowed is None else ",".join(sorted(self.allowed))
        return f"WebAccess(token={'set' if self.token else 'none'}, hosts={hosts})"

    def host_allowed(self, header: str | None) -> bool:
        """True if a request with this ``Host`` header may be answered. A request without
        one (HTTP/1.0) cannot come from a browser page, which always sends it."""
        return self.allowed is None or header is None or host_name(header) in self.allowed

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The aiohttp middleware: probes pass, then the Host, then the token."""
        if request.path in PROBES:
            return await handler(request)
        if not self.host_allowed(request.headers.get("Host")):
            return web.json_response(
                {"error": "this endpoint does not answer to that host name (Host header)"},
                status=421,
            )
        if self.token is not None and not self.token.matches(request.headers.get("Authorization")):
            return await self.refused(request)
        return await handler(request)

    async def refused(self, request: web.Request) -> web.StreamResponse:
        """``401``; for the page, the page itself (it has no data: its script asks for
        the token and sends it as a header)."""
        headers = {"WWW-Authenticate": 'Bearer realm="flowkit"', "Cache-Control": "no-store"}
        if request.path == "/" and self.page is not None:
            return self.page(401, headers)
        return web.json_response(
            {"error": "this endpoint needs its token: Authorization: Bearer <token>"},
            status=401,
            headers=headers,
        )
