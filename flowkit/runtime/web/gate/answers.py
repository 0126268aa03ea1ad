"""What the gate sends: the whole HTTP answers it gives itself (``503`` to a connection past
the limit, a probe's answer), and the reset of a connection it does not answer."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

from .sniffing import request_path

__all__ = ["BUSY", "STUCK", "overflow_answer", "probe_answer", "reset"]

RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close with a reset, no TIME_WAIT


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
    path = request_path(request.partition(b"\r\n")[0])
    if path is None:
        return BUSY
    return answer(path) or BUSY


def reset(conn: socket.socket) -> None:
    """Close with a reset: nothing more is read or sent, and no TIME_WAIT is left."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    except OSError:
        pass
    conn.close()
