"""The gate's loop: accepting the connections, passing those within the limit to the worker,
answering the probes and the connections past the limit (see the package's docstring)."""

from __future__ import annotations

import math
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable

from .answers import BUSY, STUCK, overflow_answer, reset
from .pacer import Pacer
from .sniffing import OVERFLOW_READ, peek

__all__ = [
    "ACCEPT_RETRY",
    "ACCEPTS",
    "DRAIN",
    "HOLD",
    "OVERFLOW_TIMEOUT",
    "QUICK_REFUSALS",
    "REFUSALS",
    "Gate",
]

OVERFLOW_TIMEOUT = 0.25  # seconds one past the limit has for its request (sent at once)
REFUSALS = 200  # connections past the limit given a moment per second, at most
QUICK_REFUSALS = 2000  # 503s sent per second, at most (the rest wait their turn)
PROBE_ANSWERS = 200  # probes past the limit answered at once per second, at most
TOGETHER = 0.01  # seconds: 503s due within this go out together (one wakeup for them)
HOLD = 4096  # connections past the limit held at a time, at most (then the kernel's queue)
DRAIN = 0.5  # seconds the gate answers what came after its worker stopped, at most
ACCEPT_RETRY = 0.1  # seconds before accepting again after a failure (no descriptors)
ACCEPTS = 64  # connections accepted in a row before the control socket is read again
READ_AGAIN = 0.01  # seconds between looks at a request that has not said what it is yet


class Gate:
    """The gate's loop over ``listening`` and ``control`` (see the package's docstring)."""

    def __init__(
        self,
        listening: socket.socket,
        control: socket.socket,
        max_connections: int,
        max_overflow: int,
        answer_life: float,
        clock: Callable[[], float] = time.monotonic,
        hold: int = HOLD,
    ) -> None:
        self.listening = listening
        self.family = listening.family
        # Accepting a bare descriptor: ``socket.accept`` looks the family and type up
        # again, through enums, for each connection, which costs more than the accept.
        self._accept_fd: Callable[[], tuple[int, object]] = listening._accept  # type: ignore[attr-defined]  # noqa: SLF001
        self.control = control
        self.max_connections = max_connections
        self.max_overflow = max_overflow
        self.answer_life = answer_life  # seconds a probe's answer is given, unless sent again
        self.clock = clock
        self.hold = hold  # connections past the limit held at a time, at most
        self.held = 0  # connections passed to the worker and not closed yet
        self.refused = 0
        # path -> the answer to a probe, and until when it may be given
        self.answers: dict[str, tuple[bytes, float]] = {}
        # the probes answered here within the limit too (the worker pushes their answers)
        self.everywhere: set[str] = set()
        # connections within the limit whose request has not said yet whether it is one
        # of those probes: until when they may take to say it
        self.reading: dict[socket.socket, float] = {}
        # connections the worker could not be passed (it was gone): answered at the end
        self.orphans: list[socket.socket] = []
        # connections past the limit given a moment: their deadline and what they sent
        self.waiting: dict[socket.socket, tuple[float, bytearray]] = {}
        # connections past the limit waiting for their turn: when, and their answer
        self.queue: deque[tuple[float, socket.socket, bytes]] = deque()
        self.quick = Pacer(QUICK_REFUSALS, QUICK_REFUSALS // 4, math.inf, clock)
        self.probes = Pacer(PROBE_ANSWERS, PROBE_ANSWERS // 4, 0.0, clock)
        self.slow = Pacer(REFUSALS, REFUSALS // 4, 0.0, clock)
        self.accepting = False
        self.resume_at: float | None = None  # accepting paused until then (None: until room)
        self.open = True
        self.selector = selectors.DefaultSelector()

    def run(self) -> None:
        """Serve until the worker's end of the control socket closes; then answer what
        has come, and close the listening socket."""
        listening, control = self.listening, self.control
        listening.setblocking(False)
        control.setblocking(True)  # read only when readable; at most a few sends in flight
        self.selector.register(control, selectors.EVENT_READ)
        self._listen(True)
        while self.open:
            events = self.selector.select(self._timeout())
            ready = {key.fileobj for key, _ in events}
            if control in ready:  # first: closed connections free places, answers
                ready.discard(control)
                if not self._latest():
                    break
            for conn in ready:
                if conn is listening:
                    self._accept()
                elif conn in self.waiting:
                    assert isinstance(conn, socket.socket)
                    self._readable(conn)
            self._expire()
        self.drain()

    def _timeout(self) -> float | None:
        deadlines = [deadline for deadline, _ in self.waiting.values()]
        if self.reading:
            deadlines.append(self.clock() + READ_AGAIN)
        if self.queue:
            deadlines.append(self.queue[0][0])
        if self.resume_at is not None:
            deadlines.append(self.resume_at)
        return max(0.0, min(deadlines) - self.clock()) if deadlines else None

    def _told(self, message: bytes) -> bool:
        if not message:  # the worker stopped, or died
            return False
        kind = message[:1]
        if kind == b"-":
            self.held -= len(message)
        elif kind in b"ap":
            path, _, answer = message[1:].partition(b" ")
            name = path.decode("latin-1")
            self.answers[name] = answer, self.clock() + self.answer_life
            if kind == b"p":
                self.everywhere.add(name)
        return True

    def _latest(self) -> bool:
        """Read what the worker has sent meanwhile (before answering a probe too: an
        answer it pushed before the probe came is the one to give); False (and ``open``
        too) once it is gone."""
        while self.open:
            try:
                message = self.control.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                message = b""
            if not self._told(message):
                self.open = False
        return self.open

    def _accept(self) -> None:
        admitted: list[int] = []
        try:
            for _ in range(ACCEPTS):
                if len(self.queue) + len(self.waiting) >= self.hold:
                    self._pause(None)  # the rest wait in the kernel's queue, for room here
                    return
                try:
                    fd, _ = self._accept_fd()
                except BlockingIOError:
                    return
                except OSError as exc:  # out of file descriptors, say: wait for some
                    self._tell(f"!{exc.errno} {exc.strerror}".encode())
                    self._pause(ACCEPT_RETRY)
                    return
                if self.held + len(admitted) < self.max_connections:
                    if not self.everywhere:
                        admitted.append(fd)
                    elif (kept := self._sort(fd)) is not None:
                        admitted.append(kept)
                    continue
                self.refused += 1
                self._refuse(socket.socket(self.family, socket.SOCK_STREAM, 0, fd))
        finally:
            if admitted:
                self._admit(admitted)

    def _sort(self, fd: int) -> int | None:
        """A connection within the limit: its descriptor to pass to the worker, or None
        when a probe's, answered here (or read here until its request says which)."""
        conn = socket.socket(self.family, socket.SOCK_STREAM, 0, fd)
        kind, _ = peek(conn, self.everywhere)
        if kind == "other":
            return conn.detach()
        self.held += 1  # its place, until it is answered here or passed
        if kind == "probe":
            self._probe(conn)
        else:  # its request has not said yet
            # Looked at again every few milliseconds, not when readable: what it sent is
            # left unread for the worker, so it would be readable all along.
            self.reading[conn] = self.clock() + OVERFLOW_TIMEOUT
        return None

    def _probe(self, conn: socket.socket) -> None:
        """Answer a probe within the limit here, with the worker's latest answer; its
        place is free again."""
        self.held -= 1
        try:
            sent = conn.recv(OVERFLOW_READ, socket.MSG_DONTWAIT)
        except OSError:
            sent = b""
        self._reply(conn, overflow_answer(sent, self._answer_to) or BUSY)

    def _read_more(self, conn: socket.socket) -> None:
        """Look again at a connection within the limit whose request had not said what it
        is: once it says, or its moment is over, pass it or answer it."""
        kind, sent = peek(conn, self.everywhere)
        if kind == "unknown" and self.reading[conn] > self.clock():
            return
        del self.reading[conn]
        if kind == "other" or b"\r\n" not in sent:
            self.held -= 1  # (its place, taken again as it is passed)
            self._admit([conn.detach()])  # (the worker's own header timeout applies)
        else:  # a probe, whole or at its deadline
            self._probe(conn)

    def _admit(self, fds: list[int]) -> None:
        """Pass connections to the worker, in one message (one wakeup of its loop)."""
        try:
            socket.send_fds(self.control, [b"c"], fds)
            self.held += len(fds)
        except OSError:
            self.open = False  # the worker is gone: answered when the gate drains
            self.orphans += [socket.socket(self.family, socket.SOCK_STREAM, 0, fd) for fd in fds]
            return
        for fd in fds:
            os.close(fd)  # (the worker has its own descriptors of them now)

    def _refuse(self, conn: socket.socket) -> None:
        """Answer a connection past the limit, queue its answer, or give it a moment."""
        try:
            sent = conn.recv(OVERFLOW_READ, socket.MSG_DONTWAIT)
            if not sent:  # closed before it said anything
                conn.close()
                return
        except BlockingIOError:
            sent = b""  # nothing yet
        except OSError:
            conn.close()
            return
        answer = overflow_answer(sent, self._answer_to)
        if answer is not None:
            self._reply(conn, answer)
        elif len(self.waiting) < self.max_overflow and self.slow.delay() is not None:
            conn.setblocking(False)
            self.waiting[conn] = (self.clock() + OVERFLOW_TIMEOUT, bytearray(sent))
            self.selector.register(conn, selectors.EVENT_READ)
        else:
            reset(conn)

    def _reply(self, conn: socket.socket, answer: bytes) -> None:
        """A probe's answer now (within its pace); a 503, or a probe past that pace, in
        its turn."""
        if answer is not BUSY and self.probes.delay() is not None:
            self._answer(conn, answer)
            return
        due = self.clock() + (self.quick.delay() or 0.0)
        if not self.queue and due <= self.clock():
            self._answer(conn, answer)
        else:
            self.queue.append((due, conn, answer))

    def _readable(self, conn: socket.socket) -> None:
        """A connection given a moment sent more."""
        _, sent = self.waiting[conn]
        try:
            data = conn.recv(OVERFLOW_READ)
        except BlockingIOError:
            return
        except OSError:
            self._forget(conn)
            conn.close()
            return
        sent += data
        if not data or b"\r\n\r\n" in sent or len(sent) > OVERFLOW_READ:
            self._forget(conn)
            self._reply(conn, overflow_answer(bytes(sent), self._answer_to) or BUSY)

    def _answer_to(self, path: str) -> bytes | None:
        if path not in self.answers:
            return None
        self._latest()
        answer, until = self.answers[path]
        if until > self.clock():
            return answer
        return STUCK if path in self.everywhere else None

    def _expire(self) -> None:
        now = self.clock()
        queue = self.queue
        while queue and queue[0][0] <= now + TOGETHER:
            _, conn, answer = queue.popleft()
            self._answer(conn, answer)
        for conn in [c for c, (deadline, _) in self.waiting.items() if deadline <= now]:
            self._forget(conn)
            reset(conn)  # no answer: a client that sends nothing reads nothing either
        for conn in list(self.reading):
            self._read_more(conn)
        paused = self.resume_at is not None and self.resume_at > now
        if not (self.accepting or paused) and len(queue) + len(self.waiting) < self.hold:
            self._listen(True)

    def drain(self) -> None:
        """The worker is gone: answer at once what has come, for ``DRAIN`` seconds at
        most (a probe with the worker's last answer, the rest ``503``; one that has not
        sent its request is reset), and close the listening socket, so that nothing the
        kernel accepted is reset unread."""
        for conn in list(self.waiting):
            _, sent = self.waiting[conn]
            self._forget(conn)
            self._answer_or_reset(conn, bytes(sent))
        self.orphans += self.reading
        self.reading.clear()
        for conn in self.orphans:  # passed to nobody: answered from what they sent
            self._answer_or_reset(conn, None)
        self.orphans.clear()
        while self.queue:
            _, conn, answer = self.queue.popleft()
            self._answer(conn, answer)
        end = self.clock() + DRAIN
        while self.clock() < end:
            try:
                fd, _ = self._accept_fd()
            except OSError:  # (BlockingIOError: nothing more has come)
                break
            conn = socket.socket(self.family, socket.SOCK_STREAM, 0, fd)
            self._answer_or_reset(conn, None)
        self.listening.close()

    def _answer_or_reset(self, conn: socket.socket, sent: bytes | None) -> None:
        """At the end: answer ``conn`` at once from what it sent (read now if ``None``),
        or reset it if that says nothing answerable."""
        answer = None
        try:
            if sent is None:
                sent = conn.recv(OVERFLOW_READ, socket.MSG_DONTWAIT)
            answer = overflow_answer(sent, self._answer_to)
        except OSError:
            pass
        if answer is None:
            reset(conn)
        else:
            self._answer(conn, answer)

    def _forget(self, conn: socket.socket) -> None:
        del self.waiting[conn]
        self.selector.unregister(conn)

    @staticmethod
    def _answer(conn: socket.socket, answer: bytes) -> None:
        try:
            # (a small answer: the socket's buffer takes it whole)
            conn.send(answer, socket.MSG_DONTWAIT)
        except OSError:
            pass
        conn.close()

    def _listen(self, on: bool) -> None:
        if on != self.accepting:
            if on:
                self.selector.register(self.listening, selectors.EVENT_READ)
                self.resume_at = None
            else:
                self.selector.unregister(self.listening)
            self.accepting = on

    def _pause(self, seconds: float | None) -> None:
        """Stop accepting for ``seconds`` (None: until there is room to hold more)."""
        self._listen(False)
        self.resume_at = None if seconds is None else self.clock() + seconds

    def _tell(self, message: bytes) -> None:
        try:  # (a report the worker has no room for yet is dropped: it is only a report)
            self.control.send(message, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        except OSError:
            self.open = False
