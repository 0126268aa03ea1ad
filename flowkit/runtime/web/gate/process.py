"""The gate's process: what it ignores, how it is scheduled, the file descriptors it may
take, and its ``main``."""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys

from .loop import HOLD, Gate

__all__ = ["main", "yield_to_worker"]


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
