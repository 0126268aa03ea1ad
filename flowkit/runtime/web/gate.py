"""The gate of a worker's web endpoint: a small process that accepts its connections,
hands the worker those within its limit, and answers the rest itself.

A crowd that connects again and again must not cost the worker's records their time.
Accepting, reading and answering a refused connection is Python work, and a thread
would do it under the same interpreter lock as the records; so it is done in a process
of its own. ``BoundedListener`` (``web.limits``) binds the socket, then starts this
module as a script (``python -I -S gate.py``: standard library only, so it starts in
milliseconds and loads nothing of flowkit or the app), giving it the listening socket
and one end of a control socket. The gate:

- accepts every connection as it comes (up to ``HOLD`` at a time past the limit), so
  that the kernel's queue stays short: a probe is read at once, never behind a crowd;
- answers a probe (``GET /health``, ``GET /ready``) itself, on every fresh connection,
  with the answer the worker last pushed: the worker's loop may be busy with records
  for seconds, and an orchestrator gives a probe one. The worker pushes an answer as
  soon as it changes (an error, a rebalance), looks ten times a second anyway, and
  pushes it again once a second; the gate reads what was pushed before it answers. An
  answer not pushed again for ``answer_life`` seconds (3) is not given: the worker's
  loop may be stuck, and the probe gets ``503`` saying so. A probe the worker's loop
  answers itself (a process group's ``/ready``, which asks its children) is pushed
  marked for the connections past the limit only;
- passes each other connection to the worker while the worker holds fewer than
  ``max_connections`` (the worker says when one closes), leaving its request unread
  for it; one whose request has not said what it is yet is looked at again for a
  quarter of a second, then passed;
- answers a connection past the limit from what it sent already: a probe as above,
  anything else with ``503``. One whose request has not arrived yet gets a quarter of
  a second for it, while ``max_overflow`` are waiting so (200 a second at most); past
  that, it is reset;
- sends at most 2,000 of those ``503`` a second (and answers at most 200 probes a
  second at once): the rest wait for their turn, in arrival order, in the gate, and
  those due within 10 ms go out together (a wakeup for each would cost more than
  its answer);
- ends when the worker's end of the control socket closes, whether the worker stopped
  or died, after answering what has come (probes too, and the connections it could not
  pass to a worker that was gone) and closing the listening socket; it ignores the
  signals that stop a worker (``SIGINT``, ``SIGTERM``, ``SIGHUP``), which a terminal or
  a supervisor may send to the whole process group.

The control socket carries one message per send (``SOCK_SEQPACKET``). From the gate:
``c`` with the file descriptors of the connections accepted in a row (up to ``ACCEPTS``:
one wakeup of the worker's loop for them all), ``!ERRNO STRERROR`` when accepting failed.
From the worker: ``-`` once per connection closed (several may come in one message),
``pPATH ANSWER``, the whole HTTP answer to a probe on any connection, and ``aPATH
ANSWER``, one for the connections past the limit only.
"""

from __future__ import annotations

import math
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable

__all__ = [
    "ACCEPTS",
    "BUSY",
    "HOLD",
    "STUCK",
    "Gate",
    "Pacer",
    "overflow_answer",
    "probe_answer",
    "yield_to_worker",
]

OVERFLOW_READ = 4096  # bytes a connection past the limit may send before its answer
OVERFLOW_TIMEOUT = 0.25  # seconds it has to send them (a client sends at once)
REFUSALS = 200  # connections past the limit given a moment per second, at most
QUICK_REFUSALS = 2000  # 503s sent per second, at most (the rest wait their turn)
PROBE_ANSWERS = 200  # probes past the limit answered at once per second, at most
TOGETHER = 0.01  # seconds: 503s due within this go out together (one wakeup for them)
HOLD = 4096  # connections past the limit held at a time, at most (then the kernel's queue)
DRAIN = 0.5  # seconds the gate answers what came after its worker stopped, at most
ACCEPT_RETRY = 0.1  # seconds before accepting again after a failure (no descriptors)
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close with a reset, no TIME_WAIT
ACCEPTS = 64  # connections accepted in a row before the control socket is read again
READ_AGAIN = 0.01  # seconds between looks at a request that has not said what it is yet


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


def _head(status: int, reason: str, length: int) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    ).encode()


_BUSY_BODY = b'{"error": "busy: too many connections"}'
BUSY = _head(503, "Busy", len(_BUSY_BODY)) + _BUSY_BODY
_STUCK_BODY = b'{"error": "the worker has not answered lately: its event loop may be stuck"}'
STUCK = _head(503, "Service Unavailable", len(_STUCK_BODY)) + _STUCK_BODY


def probe_answer(status: int, body: bytes) -> bytes:
    """The whole HTTP answer to a probe past the limit.

    >>> probe_answer(200, b"{}").split(b"\\r\\n")[0]
    b'HTTP/1.1 200 OK'
    """
    reason = "OK" if status == 200 else "Service Unavailable"
    return _head(status, reason, len(body)) + body


def overflow_answer(request: bytes, answer: Callable[[str], bytes | None]) -> bytes | None:
    """The whole answer to a connection past the limit, from what it sent so far (None
    while its request line is not complete): ``answer(path)`` for a ``GET``, else (or
    when that is None) ``503``.

    >>> overflow_answer(b"GET /health?x HTTP/1.1\\r\\n", {"/health": b"ok"}.get)
    b'ok'
    >>> overflow_answer(b"GET /status HTTP/1.1\\r\\n", {}.get) == BUSY
    True
    >>> overflow_answer(b"GET /hea", {}.get) is None
    True
    """
    if b"\r\n" not in request:
        return None
    line = request.split(b"\r\n", 1)[0].split(b" ")
    if len(line) != 3 or line[0] != b"GET":
        return BUSY
    return answer(line[1].split(b"?", 1)[0].decode("latin-1")) or BUSY


def reset(conn: socket.socket) -> None:
    """Close with a reset: nothing more is read or sent, and no TIME_WAIT is left."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    except OSError:
        pass
    conn.close()


class Gate:
    """The gate's loop over ``listening`` and ``control`` (see the module's docstring)."""

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
        kind, _ = self._peek(conn)
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

    def _peek(self, conn: socket.socket) -> tuple[str, bytes]:
        """What a connection's request is, from what it sent so far (left unread): a
        ``probe`` of those answered here, whole; an ``other`` request; or ``unknown``
        yet (a probe whose headers are still coming, too)."""
        try:
            sent = conn.recv(OVERFLOW_READ, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return "unknown", b""
        except OSError:
            return "other", b""  # (the worker's loop sees it fail, and closes it)
        if not sent:
            return "other", sent
        line, complete, _ = sent.partition(b"\r\n")
        if not complete:
            return ("unknown" if len(sent) < OVERFLOW_READ else "other"), sent
        words = line.split(b" ")
        if len(words) != 3 or words[0] != b"GET":
            return "other", sent
        if words[1].split(b"?", 1)[0].decode("latin-1") not in self.everywhere:
            return "other", sent
        if b"\r\n\r\n" not in sent and len(sent) < OVERFLOW_READ:
            return "unknown", sent
        return "probe", sent

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
        kind, sent = self._peek(conn)
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


def yield_to_worker() -> None:
    """Where there is one (Linux), take the batch policy: waking up, the gate does not take
    the CPU from a running worker, but waits for the end of its time slice (milliseconds),
    so that a crowd's connections do not cut into the records' work at every arrival. Its
    priority stays the worker's: a lower one starves it on a busy machine, and then the
    probes past the limit wait for seconds."""
    if hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:  # not allowed here: the gate works as well without
            pass


def _descriptors(wanted: int) -> int:
    """Raise this process's soft limit of file descriptors as far as allowed, and how
    many of them the connections past the limit may take (``wanted`` at most)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = wanted + 64 if hard == resource.RLIM_INFINITY else min(hard, wanted + 64)
            if soft != resource.RLIM_INFINITY and target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    except (OSError, ValueError):
        pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - 64))


def main(argv: list[str]) -> None:
    """``gate.py LISTENING_FD CONTROL_FD MAX_CONNECTIONS MAX_OVERFLOW ANSWER_LIFE``."""
    # Ctrl+C, or a signal sent to the whole process group, is the worker's to act on: the
    # gate ends when the worker closes the control socket (or exits, which closes it).
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    yield_to_worker()
    listening_fd, control_fd, max_connections, max_overflow = (int(arg) for arg in argv[:4])
    answer_life = float(argv[4])
    listening = socket.socket(fileno=listening_fd)
    control = socket.socket(fileno=control_fd)
    try:
        gate = Gate(listening, control, max_connections, max_overflow, answer_life)
        gate.hold = _descriptors(HOLD)
        gate.run()
    except Exception as exc:  # one line in the worker's log, not a traceback on stderr
        try:
            control.send(f"!0 the web gate stopped: {exc!r}".encode())
        except OSError:
            pass
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
