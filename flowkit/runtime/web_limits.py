"""Bounds on a web endpoint that shares its event loop with the worker's records.

The endpoint runs in the worker's own event loop: every byte it parses and every answer it
builds is time the records do not get. ``WebLimits`` says how much the endpoint may take,
and ``BoundedListener`` holds it to that:

- at most ``max_connections`` connections at once (and never more than a quarter of the
  process's file descriptors). One more is answered at once and closed: a probe
  (``GET /health``, ``GET /ready``) with its answer, anything else with ``503``. One
  whose request has not arrived yet gets a quarter of a second for it, while half as many
  again wait so; past that, it is reset. At most 2,000 connections past the limit a
  second are answered (200 a second of those given a moment): the rest wait in the
  kernel's backlog, so a crowd that connects again and again costs a bounded share;
- a connection has ``header_timeout`` seconds to send a request's headers, from its
  opening and from the end of the previous answer (keep-alive); a slow sender is closed;
- a request with a body larger than ``max_body`` is ``413`` (every route is a GET);
- requests other than the probes start at most ``rate`` per second (a short burst
  passes); one that would wait more than ``max_wait`` seconds is ``503``. At most
  ``concurrency`` of them run at once. Probes skip the queue: they are cheap, and an
  orchestrator must see a busy worker alive;
- while the connections are all taken, each answer closes its connection, so a waiting
  client gets its turn.
"""

from __future__ import annotations

import asyncio
import math
import resource
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from ..errors import ConfigurationError
from .web_access import PROBES

__all__ = ["BoundedListener", "Pacer", "WebLimits"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Probe = Callable[[str], tuple[int, bytes]]  # path -> (status, JSON body)

_OVERFLOW_READ = 4096  # bytes an overflow connection may send before its answer
_OVERFLOW_TIMEOUT = 0.25  # seconds it has to send them (a client sends at once)
_BACKLOG = 128  # connections the kernel holds for us to accept
_REFUSALS = 200  # connections past the limit given a moment per second, at most
_QUICK_REFUSALS = 2000  # connections past the limit answered at once per second, at most
_ACCEPT_RETRY = 0.1  # seconds before accepting again after a failure (no descriptors)
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close with a reset, no TIME_WAIT


@dataclass(frozen=True)
class WebLimits:
    """How much of the worker a web endpoint may take (see the module's docstring).

    >>> WebLimits(max_connections=0)
    Traceback (most recent call last):
    ...
    flowkit.errors.ConfigurationError: web limits: max_connections must be at least 1, not 0
    """

    max_connections: int = 64
    header_timeout: float = 10.0
    max_body: int = 16 * 1024
    rate: float = 50.0
    burst: int = 20
    max_wait: float = 5.0
    concurrency: int = 4
    cache_seconds: float = 1.0  # how long /metrics and /status answers are reused

    def __post_init__(self) -> None:
        for name in ("max_connections", "concurrency", "burst"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"web limits: {name} must be at least 1, not {getattr(self, name)}"
                )
        for name in ("header_timeout", "rate", "max_wait"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ConfigurationError(f"web limits: {name} must be a positive number")
        if self.max_body < 0 or self.cache_seconds < 0:
            raise ConfigurationError("web limits: max_body and cache_seconds cannot be negative")

    def connections(self) -> int:
        """``max_connections``, but at most a quarter of the file descriptors the process
        may open: the rest are the broker's, the tables' and the answers' to overflow."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft <= 0:
            return self.max_connections
        return max(1, min(self.max_connections, soft // 4))


class Pacer:
    """At most ``rate`` starts per second after a burst of ``burst``, in arrival order
    (the generic cell rate algorithm: one number, the theoretical arrival time).

    >>> now = [0.0]
    >>> pacer = Pacer(rate=10.0, burst=2, max_wait=0.15, clock=lambda: now[0])
    >>> [pacer.delay() for _ in range(4)]
    [0.0, 0.0, 0.1, None]
    """

    def __init__(
        self, rate: float, burst: int, max_wait: float, clock: Callable[[], float]
    ) -> None:
        self.interval = 1.0 / rate
        self.tolerance = (burst - 1) * self.interval
        self.max_wait = max_wait
        self.clock = clock
        self._tat = 0.0

    def delay(self) -> float | None:
        """Seconds the next start must wait (taking its place), or None: it would wait
        more than ``max_wait`` (and takes no place)."""
        now = self.clock()
        tat = max(self._tat, now)
        wait = max(0.0, tat - now - self.tolerance)
        if wait > self.max_wait:
            return None
        self._tat = tat + self.interval
        return round(wait, 9)


class _Connection(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind a deadline for each request's headers."""

    def __init__(self, listener: BoundedListener, inner: asyncio.Protocol) -> None:
        self.listener = listener
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """The client owes us a request's headers within the timeout, from now."""
        self.disarm()
        if self.transport is not None and not self.transport.is_closing():
            loop = self.listener.loop
            self._deadline = loop.call_later(self.listener.limits.header_timeout, self._late)
            self.listener.waiting += 1

    def disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
            self.listener.waiting -= 1

    def _late(self) -> None:
        self._deadline = None
        self.listener.waiting -= 1
        self.listener.timeouts += 1
        if self.transport is not None:
            self.transport.abort()  # no answer: a slow sender does not read one either

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.listener.connections[transport] = self
        self.arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.transport is not None:
            self.listener.connections.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _overflow_answer(request: bytes, probe: Probe) -> bytes | None:
    """The whole answer to a connection past the limit, from what it sent so far (None
    while its request line is not complete): a probe's, else ``503``."""
    if b"\r\n" not in request:
        return None
    line = request.split(b"\r\n", 1)[0].split(b" ")
    path = line[1].split(b"?", 1)[0].decode("latin-1") if len(line) == 3 else ""
    if line[0] != b"GET" or path not in PROBES:
        return _BUSY
    status, body = probe(path)
    reason = "OK" if status == 200 else "Service Unavailable"
    return _head(status, reason, len(body)) + body


def _head(status: int, reason: str, length: int) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    ).encode()


_BUSY_BODY = b'{"error": "busy: too many connections"}'
_BUSY = _head(503, "Busy", len(_BUSY_BODY)) + _BUSY_BODY


class _Overflow(asyncio.Protocol):
    """A connection past the limit: a probe gets its answer, anything else ``503``."""

    def __init__(self, listener: BoundedListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.listener.overflow += 1
        self._timer = self.listener.loop.call_later(_OVERFLOW_TIMEOUT, transport.abort)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" in self.buffer or len(self.buffer) > _OVERFLOW_READ:
            self._answer()

    def eof_received(self) -> bool | None:
        self._answer()
        return None

    def _answer(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(_overflow_answer(self.buffer, self.listener.probe) or _BUSY)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.overflow -= 1
        if self._timer is not None:
            self._timer.cancel()


class BoundedListener:
    """Serves an aiohttp ``AppRunner`` on ``host:port`` within ``limits``.

    ``probe(path)`` answers a probe (``/health``, ``/ready``) as (status, JSON body); it
    also answers the connections past the limit. ``middleware`` goes first in the app's.
    """

    def __init__(self, limits: WebLimits, probe: Probe) -> None:
        self.limits = limits
        self.probe = probe
        self.max_connections = limits.connections()
        self.max_overflow = max(8, self.max_connections // 2)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections: dict[asyncio.Transport, _Connection] = {}
        self.waiting = 0  # connections that owe us a request's headers
        self.overflow = 0
        self.refused = 0  # connections answered past the limit, since the start
        self.timeouts = 0  # connections closed for sending their headers too slowly
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        # Connections past the limit answered per second, at most (then they wait): those
        # answered at once, and those given a moment to send their request.
        self._quick = Pacer(_QUICK_REFUSALS, _QUICK_REFUSALS // 4, math.inf, time.monotonic)
        self._refusals = Pacer(_REFUSALS, _REFUSALS // 4, math.inf, time.monotonic)
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._pacer = Pacer(limits.rate, limits.burst, limits.max_wait, time.monotonic)
        self._busy = asyncio.Semaphore(limits.concurrency)

    def runner_options(self) -> dict[str, Any]:
        """What ``web.AppRunner`` takes from the limits."""
        return {
            # aiohttp's own idle limit, as ours (ours also covers a request's headers).
            "keepalive_timeout": self.limits.header_timeout,
            "max_line_size": 8190,
            "max_field_size": 8190,
            "max_headers": 64,
            "lingering_time": 1.0,  # reading the rest of a refused body, at most
        }

    async def start(self, runner: web.AppRunner, host: str, port: int) -> int:
        """Listen (``runner`` set up); the port listened on. A name or address that does
        not resolve or bind raises ``OSError``."""
        self._loop = loop = asyncio.get_running_loop()
        server = runner.server
        assert server is not None, "set the runner up first"
        self._factory = server
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._accepting = loop.create_task(self._accept(sock), name="web-accept")
        return int(sock.getsockname()[1])

    async def _accept(self, sock: socket.socket) -> None:
        # Our own accept loop rather than asyncio's: past the limit it slows down, so
        # that a crowd connecting again and again waits in the kernel's backlog (and
        # then in its clients' SYN retries) instead of taking the worker's time.
        loop = self.loop
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors, say: wait for some
                loop.call_exception_handler(
                    {"message": "accepting a web connection failed", "exception": exc}
                )
                await asyncio.sleep(_ACCEPT_RETRY)
                continue
            conn.setblocking(False)
            if len(self.connections) < self.max_connections:
                assert self._factory is not None
                try:
                    await loop.connect_accepted_socket(
                        partial(_Connection, self, self._factory()), conn
                    )
                except OSError:
                    conn.close()
                continue
            # Past the limit. Most clients have sent their request by now: answered at
            # once, with no transport made (cheap); else given a moment, while there is
            # room for that; else reset.
            self.refused += 1
            if self._answer_now(conn):
                delay = self._quick.delay()
            elif self.overflow < self.max_overflow:
                delay = self._refusals.delay()
                try:
                    await loop.connect_accepted_socket(partial(_Overflow, self), conn)
                except OSError:
                    conn.close()
            else:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                conn.close()
                delay = self._quick.delay()
            if delay:
                await asyncio.sleep(delay)

    def _answer_now(self, conn: socket.socket) -> bool:
        """Answer a connection past the limit from what it sent already, if it did."""
        try:
            answer = _overflow_answer(conn.recv(_OVERFLOW_READ), self.probe)
        except BlockingIOError:
            return False
        except OSError:
            conn.close()
            return True
        if answer is None:
            return False
        try:
            conn.send(answer)  # (a small answer: the socket's buffer takes it whole)
        except OSError:
            pass
        conn.close()
        return True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "not started"
        return self._loop

    def close(self) -> None:
        """Stop accepting; open connections are the runner's to close."""
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    @property
    def full(self) -> bool:
        """Every connection is taken."""
        return len(self.connections) >= self.max_connections

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The request's headers are in: stop its clock, bound its work, start the next."""
        connection = self.connections.get(request.transport)  # type: ignore[arg-type]
        if connection is not None:
            connection.disarm()
        try:
            response = await self._bounded(request, handler)
            if self.full:
                response.force_close()  # a waiting client gets this connection's place
            return response
        finally:
            if connection is not None:
                connection.arm()

    async def _bounded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBES:
            return await handler(request)
        if (request.content_length or 0) > self.limits.max_body or (
            request.content_length is None and request.body_exists
        ):
            return _close(web.json_response({"error": "request body too large"}, status=413))
        delay = self._pacer.delay()
        if delay is None:
            body = {"error": "busy: too many requests; try again"}
            return _close(web.json_response(body, status=503, headers={"Retry-After": "1"}))
        if delay:
            await asyncio.sleep(delay)
        async with self._busy:
            return await handler(request)


def _close(response: web.StreamResponse) -> web.StreamResponse:
    response.force_close()
    return response
