"""How the gate tells, from a connection's first bytes, whether its request is a probe it
answers itself (``GET /health``, ``GET /ready``: the paths the worker pushes answers for
on every connection), without reading them: what it looks at stays unread for the worker
when the connection is not one.

A request is sorted into three kinds: a ``probe`` (its request line names a probe's path
and its headers have ended, or filled what the gate looks at), ``other`` (anything else,
a connection closed or failing too: the worker's loop sees that and closes it), or
``unknown`` while its first line or headers are still coming.

>>> sniff(b"GET /ready?x HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n", {"/ready"})
'probe'
>>> sniff(b"GET /ready HTTP/1.1\\r\\nHost: a\\r\\n", {"/ready"}), sniff(b"GET /rea", {"/ready"})
('unknown', 'unknown')
>>> sniff(b"GET /readyz HTTP/1.1\\r\\n\\r\\n", {"/ready"}), sniff(b"", {"/ready"})
('other', 'other')
"""

from __future__ import annotations

import socket
from collections.abc import Container

__all__ = ["OVERFLOW_READ", "peek", "request_path", "sniff"]

OVERFLOW_READ = 4096  # bytes a connection past the limit may send before its answer


def request_path(line: bytes) -> str | None:
    """The path of a ``GET`` request line, its query cut off; None for any other line.

    >>> request_path(b"GET /health?x=1 HTTP/1.1"), request_path(b"POST /health HTTP/1.1")
    ('/health', None)
    """
    words = line.split(b" ")
    if len(words) != 3 or words[0] != b"GET":
        return None
    return words[1].split(b"?", 1)[0].decode("latin-1")


def sniff(sent: bytes, probes: Container[str]) -> str:
    """What a request is from ``sent``, its first bytes (at most ``OVERFLOW_READ``): a
    ``probe`` of a path in ``probes``, whole; an ``other`` request; or ``unknown`` yet (a
    probe whose headers are still coming, too)."""
    if not sent:
        return "other"  # (closed before it said anything)
    line, complete, _ = sent.partition(b"\r\n")
    if not complete:
        return "unknown" if len(sent) < OVERFLOW_READ else "other"
    if request_path(line) not in probes:
        return "other"
    if b"\r\n\r\n" not in sent and len(sent) < OVERFLOW_READ:
        return "unknown"
    return "probe"


def peek(conn: socket.socket, probes: Container[str]) -> tuple[str, bytes]:
    """What ``conn``'s request is (``sniff``), from what it sent so far, left unread; and
    those bytes."""
    try:
        sent = conn.recv(OVERFLOW_READ, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return "unknown", b""
    except OSError:
        return "other", b""  # (the worker's loop sees it fail, and closes it)
    return sniff(sent, probes), sent
