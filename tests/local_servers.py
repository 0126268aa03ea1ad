"""What the test brokers (Tansu, Apache Kafka, the moto S3 server) share: a free loopback
port, a child process that dies with the test session, and a readiness wait with a deadline.

Every server process a test session starts is registered here and killed (SIGKILL, by its
own pid) when the session ends: by the fixtures' finalizers, by ``atexit`` if a test run is
interrupted, and by the kernel (``PR_SET_PDEATHSIG``) if the pytest process itself is killed.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["free_port", "kill", "listening", "spawn", "wait_ready"]

_LIVE: set[subprocess.Popen[bytes]] = set()
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the test session is SIGKILLed, the kernel
    # kills its servers too (atexit and finalizers never run then). The signal is sent when
    # the thread that started the child exits, so children are started from the main thread.
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    cmd: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own, stdout and stderr appended to ``log_path``;
    it is killed when the test session ends, whatever way it ends."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    _LIVE.add(proc)
    return proc


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` (and only it) if it still runs, and reap it."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    _LIVE.discard(proc)


def wait_ready(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], deadline: float, *, step: float = 0.05
) -> bool:
    """Poll ``ready()`` until it holds (True), the process exits or ``deadline`` seconds
    pass (False)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        if ready():
            return True
        time.sleep(step)
    return False


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        kill(proc)
