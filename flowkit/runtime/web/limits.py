"""Bounds on a web endpoint that shares its event loop with the worker's records.

The endpoint's routes run in the worker's own event loop: every byte they parse and every
answer they build is time the records do not get. ``WebLimits`` says how much the endpoint
may take, and ``BoundedListener`` holds it to that:

- at most ``max_connections`` connections at once (and never more than a quarter of the
  process's file descriptors), each accepted once its request begins (on Linux: one
  that says nothing waits in the kernel, holding no place). One more is answered at
  once and closed: a probe (``GET /health``, ``GET /ready``) with its answer, anything
  else with ``503``. One whose request has not arrived yet gets a quarter of a second
  for it, while half as many again wait so; past that, it is reset. At most 2,000
  connections past the limit a second are answered (200 a second of those given a
  moment): the rest wait in the kernel's backlog. A worker's endpoint leaves all this
  to its gate, a small process of its own (``web.gate``), so that a crowd connecting
  again and again costs the records nothing; the gate holds the waiting connections
  itself, so that probes never wait behind them, answers every probe on a fresh
  connection from the answers the worker pushes it, and answers what has come when the
  worker stops. Should the gate not start, or stop early, the worker's loop does it
  (and answers at its close what the kernel accepted for it);
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
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import structlog
from aiohttp import web

from . import gate as web_gate
from .access import PROBES
from .gate import (
    ACCEPT_RETRY,
    ACCEPTS,
    BUSY,
    DRAIN,
    OVERFLOW_READ,
    OVERFLOW_TIMEOUT,
    QUICK_REFUSALS,
    REFUSALS,
    Pacer,
    overflow_answer,
    probe_answer,
    reset,
)
from .settings import WebLimits

__all__ = ["BoundedListener", "Pacer", "WebLimits"]

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Probe = Callable[[str], tuple[int, bytes]]  # path -> (status, JSON body)

# Connections the kernel holds for us to accept (at most net.core.somaxconn). A crowd
# waits there for the gate; a shorter queue overflows into SYN cookies, which hand over a
# connection before its request has come (skipping TCP_DEFER_ACCEPT), and the gate must
# then reset it or give it a moment: several times the work of answering it.
_BACKLOG = 2048
_ANSWERS_EVERY = 0.1  # seconds between looks at the probes' answers, for the gate
_ANSWERS_AGAIN = 1.0  # seconds after which an unchanged answer is sent again (it is fresh)
_ANSWER_LIFE = 3.0  # seconds the gate gives an answer not sent again (the loop is stuck)
_GATE_END = 2.0  # seconds the gate has to answer what came before it ends, at most


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
        self.listener.admitted += 1
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
            self.listener.released()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


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
        self._timer = self.listener.loop.call_later(OVERFLOW_TIMEOUT, transport.abort)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" in self.buffer or len(self.buffer) > OVERFLOW_READ:
            self._answer()

    def eof_received(self) -> bool | None:
        self._answer()
        return None

    def _answer(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(overflow_answer(self.buffer, self.listener.answer) or BUSY)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.overflow -= 1
        if self._timer is not None:
            self._timer.cancel()


class BoundedListener:
    """Serves an aiohttp ``AppRunner`` on ``host:port`` within ``limits``.

    ``probe(path)`` answers a probe (``/health``, ``/ready``) as (status, JSON body); it
    also answers the connections past the limit. ``middleware`` goes first in the app's.
    With ``gate``, a gate process (``web.gate``) accepts the connections and refuses
    those past the limit, so that refusing them takes no time from this event loop; it
    answers the probes of ``gate_probes`` on every fresh connection, from the answers
    this process pushes it (``probes_changed`` pushes them at once).
    """

    def __init__(
        self,
        limits: WebLimits,
        probe: Probe,
        *,
        gate: bool = False,
        gate_probes: frozenset[str] = PROBES,
    ) -> None:
        self.limits = limits
        self.probe = probe
        self.gate = gate
        self.gate_probes = gate_probes
        self.max_connections = limits.connections()
        self.max_overflow = max(8, self.max_connections // 2)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections: dict[asyncio.Transport, _Connection] = {}
        self.waiting = 0  # connections that owe us a request's headers
        self.overflow = 0
        self.admitted = 0  # connections served, since the start
        self.refused = 0  # connections answered past the limit by this loop, since the start
        self.timeouts = 0  # connections closed for sending their headers too slowly
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        # Connections past the limit answered per second, at most (then they wait): those
        # answered at once, and those given a moment to send their request.
        self._quick = Pacer(QUICK_REFUSALS, QUICK_REFUSALS // 4, math.inf, time.monotonic)
        self._refusals = Pacer(REFUSALS, REFUSALS // 4, math.inf, time.monotonic)
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._pacer = Pacer(limits.rate, limits.burst, limits.max_wait, time.monotonic)
        self._busy = asyncio.Semaphore(limits.concurrency)
        # The gate process, and this side of its control socket (see ``web.gate``).
        self._gate: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._unsent = 0  # closed connections the gate has not been told of yet
        self._answering: asyncio.Task[None] | None = None
        self._sent: dict[str, tuple[bytes, float]] = {}  # path -> answer pushed, and when
        self._tasks: set[asyncio.Task[None]] = set()

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
            if hasattr(socket, "TCP_DEFER_ACCEPT"):  # Linux
                # A connection is accepted once its request begins, so that one past the
                # limit is answered at once, and one that says nothing takes no place.
                defer = math.ceil(self.limits.header_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, defer)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        if not (self.gate and self._open_gate(sock)):
            self._accept_here()
        return int(sock.getsockname()[1])

    def answer(self, path: str) -> bytes | None:
        """The whole HTTP answer to a probe past the limit (None: not a probe)."""
        return probe_answer(*self.probe(path)) if path in PROBES else None

    # -- the gate -------------------------------------------------------------------------

    def _open_gate(self, sock: socket.socket) -> bool:
        """Start the gate on ``sock``; False if it cannot start."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours  # the first answers wait there for the gate: none goes without
        self._push(again=0.0)
        self._control = None
        fds = (sock.fileno(), theirs.fileno())
        command = [sys.executable, "-I", "-S", str(web_gate.SCRIPT), *map(str, fds)]
        command += [str(self.max_connections), str(self.max_overflow), str(_ANSWER_LIFE)]
        try:
            self._gate = subprocess.Popen(
                command,
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={},  # it needs none, and the worker's may hold secrets
            )
        except (OSError, ValueError) as exc:  # no interpreter to run it, say
            ours.close()
            log.warning(
                "the web endpoint's gate did not start; this process accepts its connections",
                error=repr(exc),
            )
            return False
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self.loop.add_reader(ours.fileno(), self._from_gate)
        self._answering = self.loop.create_task(self._send_answers(), name="web-gate-answers")
        return True

    def _from_gate(self) -> None:
        control = self._control
        assert control is not None
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(control, 1024, ACCEPTS)
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                self._spawn(self._serve(conn))
            if not message:
                self._gate_gone()
                return
            if message[:1] == b"!":  # the gate could not accept, or stops
                number, _, text = message[1:].decode("utf-8", "replace").partition(" ")
                context: dict[str, Any] = {"message": text}
                if number != "0":
                    context["message"] = "accepting a web connection failed"
                    context["exception"] = OSError(int(number), text)
                self.loop.call_exception_handler(context)

    async def _send_answers(self) -> None:
        # The gate answers the probes with this process's latest answers, for a while
        # (``_ANSWER_LIFE``): pushed when they change (at once through
        # ``probes_changed``, else at the next look), and again once a second by the
        # clock (counting looks instead, a loop slowed by its records would let the
        # gate's answers expire while it still answers).
        while True:
            self._push(again=_ANSWERS_AGAIN)
            await asyncio.sleep(_ANSWERS_EVERY)

    def probes_changed(self) -> None:
        """What a probe answers may have changed (an error, readiness): push the answers
        that did to the gate now, so that the next probe it answers says so."""
        self._push(again=math.inf)

    def _push(self, again: float) -> None:
        """Tell the gate each probe's answer that changed, or was told ``again`` seconds
        ago or more: ``p`` those it answers on every connection, ``a`` the others (past
        the limit only)."""
        if self._control is None:
            return
        now = time.monotonic()
        for path in PROBES:
            answer = probe_answer(*self.probe(path))
            last, at = self._sent.get(path, (b"", -math.inf))
            if answer == last and now - at < again:
                continue
            kind = b"p" if path in self.gate_probes else b"a"
            if self._tell(kind + path.encode() + b" " + answer):
                self._sent[path] = answer, now

    def released(self) -> None:
        """A connection served is closed: the gate may pass another."""
        if self._control is None:
            return
        self._unsent += 1
        if self._tell(b"-" * self._unsent):
            self._unsent = 0

    def _tell(self, message: bytes) -> bool:
        if self._control is None:
            return False
        try:
            self._control.send(message)
            return True
        except OSError:  # full (then with the next message), or the gate is gone
            return False

    def _gate_gone(self) -> None:
        """The gate ended before the endpoint: this loop accepts from now on."""
        self._close_gate()
        code = self._gate.poll() if self._gate is not None else None
        log.warning(
            "the web endpoint's gate stopped; this process accepts its connections",
            exit_status=code,
        )
        if self._socket is not None:
            self._accept_here()

    def _close_gate(self) -> None:
        if self._answering is not None and self._control is not None:
            self._push(again=0.0)  # the last answers, for the connections the gate has
        if self._answering is not None:
            self._answering.cancel()
            self._answering = None
        control, self._control = self._control, None
        if control is not None:
            self.loop.remove_reader(control.fileno())
            self._answer_passed(control)
            control.close()  # the gate ends when it sees this

    def _answer_passed(self, control: socket.socket) -> None:
        """Answer here, from what they sent (a probe with its answer), the connections the
        gate passed that this loop has not taken: closing the control socket would reset
        them unanswered."""
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(control, 1024, ACCEPTS)
            except OSError:  # (BlockingIOError: none left)
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                if not self._answer_now(conn):
                    reset(conn)
            if not message:
                return

    # -- accepting in this loop -----------------------------------------------------------

    def _accept_here(self) -> None:
        assert self._socket is not None
        self._accepting = self.loop.create_task(self._accept(self._socket), name="web-accept")

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
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            conn.setblocking(False)
            if len(self.connections) < self.max_connections:
                await self._serve(conn)
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
                reset(conn)
                delay = self._quick.delay()
            if delay:
                await asyncio.sleep(delay)

    async def _serve(self, conn: socket.socket) -> None:
        """Serve an accepted connection within the limits."""
        assert self._factory is not None
        protocol = _Connection(self, self._factory())
        try:
            await self.loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            if protocol.transport is None:  # (else its connection_lost says so)
                self.released()

    def _answer_now(self, conn: socket.socket) -> bool:
        """Answer a connection past the limit from what it sent already, if it did."""
        try:
            answer = overflow_answer(conn.recv(OVERFLOW_READ), self.answer)
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

    def _answer_queued(self, sock: socket.socket) -> None:
        """Answer here what the kernel accepted and this loop has not (for ``DRAIN``
        seconds at most), as the gate does when it ends: closing the listening socket
        would reset them unanswered."""
        end = time.monotonic() + DRAIN
        while time.monotonic() < end:
            try:
                conn, _ = sock.accept()
            except OSError:  # (BlockingIOError: none left)
                return
            conn.setblocking(False)
            if not self._answer_now(conn):
                reset(conn)  # it has sent nothing yet: it reads nothing either

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)  # (a task nobody holds may be collected while it runs)
        task.add_done_callback(self._tasks.discard)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "not started"
        return self._loop

    def close(self) -> None:
        """Stop accepting (the gate too); open connections are the runner's to close."""
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
            if self._socket is not None:
                self._answer_queued(self._socket)
        for task in list(self._tasks):
            task.cancel()
        if self._control is not None:
            self._close_gate()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def aclose(self) -> None:
        """``close``, and end the gate. Idempotent."""
        if self._tasks:  # connections the gate passed, being taken: not reset midway
            await asyncio.wait(list(self._tasks), timeout=_GATE_END)
        self.close()
        gate, self._gate = self._gate, None
        if gate is not None:
            # It answers what has come, then ends (seeing the control socket closed);
            # a gate that does not is killed.
            try:
                await asyncio.to_thread(gate.wait, _GATE_END)
            except subprocess.TimeoutExpired:
                gate.kill()
                await asyncio.to_thread(gate.wait)

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
