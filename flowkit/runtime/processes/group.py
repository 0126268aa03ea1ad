"""Several worker processes of one app under one supervising parent (``--processes N``).

The parent runs no worker itself. It starts N copies of a worker command line, each in a
session of its own (a Ctrl-C in the terminal reaches the parent only, which passes one
SIGTERM to each child: a graceful stop, with the final commit and the shutdown hooks), and
keeps them running: a child that dies (an exit status other than 0) is started again after a
backoff (1 s, doubling, at most 30 s; back to 1 s once a child ran for a minute), with one
log line saying which, how it ended and when it comes back. The children join one
consumer group, so Kafka shares the partitions between them; there is no coordinator.

Each child gets, through its environment, its index (``FLOWKIT_PROCESS``), the parent's
directory (``FLOWKIT_PROCESS_DIR``, where it writes the address of its private web
endpoint) and ``PROMETHEUS_MULTIPROC_DIR``, where prometheus-client's multiprocess mode
keeps its counters, gauges and histograms in files that outlive it. The parent owns that
directory and removes it when it is done. A child also reads its stdin, a pipe from the
parent: when the parent dies, the pipe closes and the child stops too.

Secrets (``secrets=``, such as the web token) are not put in a child's environment, which
its user's other processes may read (``/proc/PID/environ``) and its own children inherit:
each child inherits the read end of a pipe holding them, whose number is in
``FLOWKIT_PROCESS_SECRETS_FD``, and reads them once with ``inherited_secrets()``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import multiprocess as _multiprocess

from ..lifecycle.secrets import SECRETS_VAR, inherited_secrets

__all__ = ["Child", "ProcessGroup", "describe_exit", "inherited_secrets"]

log = structlog.get_logger(__name__)
multiprocess: Any = _multiprocess  # prometheus-client's multiprocess module has no types

USAGE = 2  # a child's exit code for bad input: starting it again cannot help
INDEX_VAR = "FLOWKIT_PROCESS"
DIR_VAR = "FLOWKIT_PROCESS_DIR"
METRICS_VAR = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class Child:
    """One slot of the group: its current process, and what happened to the ones before."""

    index: int
    directory: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    exits: list[int] = field(default_factory=list)
    final: int | None = None  # the exit code of the process that was running at the stop

    @property
    def pid(self) -> int | None:
        """The running process's id (None between a death and the restart)."""
        process = self.process
        return process.pid if process is not None and process.returncode is None else None

    @property
    def report(self) -> Path:
        """Where the child writes the address of its private web endpoint."""
        return self.directory / f"process-{self.index}.json"

    def url(self) -> str | None:
        """The running process's private web endpoint, once it serves one."""
        pid = self.pid
        try:
            data: dict[str, Any] = json.loads(self.report.read_text())
        except (OSError, ValueError):
            return None
        url = data.get("url")
        # A file left by the process before a restart names a dead endpoint.
        return url if pid is not None and data.get("pid") == pid and isinstance(url, str) else None


def describe_exit(code: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL`` (asyncio reports a signal as -N)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class ProcessGroup:
    """Runs ``count`` copies of ``argv`` and keeps them running until ``stop()``.

    ``async with ProcessGroup(argv, 2) as group: code = await group.run()``; leaving the
    block removes the group's directory (the metrics files included), so read
    ``group.metrics_dir`` before that.
    """

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        *,
        env: Mapping[str, str] | None = None,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        stable_after: float = 60.0,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("a process group needs at least one process")
        self.argv = list(argv)
        self.env = dict(os.environ if env is None else env)
        self._secrets = json.dumps(dict(secrets or {})).encode()
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stable_after = stable_after
        self.directory = Path(tempfile.mkdtemp(prefix="flowkit-processes-"))
        self.metrics_dir = self.directory / "metrics"
        self.metrics_dir.mkdir()
        self.children = [Child(i, self.directory) for i in range(1, count + 1)]
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.failed: str | None = None  # why the group gave up (a child's bad input)
        self._stopping = asyncio.Event()
        self._signals = 0

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stopping.is_set()

    @property
    def elapsed(self) -> float:
        """Seconds since the group started (until it stopped)."""
        if self.started_at is None:
            return 0.0
        end = self.stopped_at if self.stopped_at is not None else time.monotonic()
        return end - self.started_at

    async def run(self) -> int:
        """Start the children; return once all have exited after ``stop()``: 0 if every
        last process exited cleanly, 2 if one refused its input, else 1."""
        self.started_at = time.monotonic()
        log.info(
            "starting worker processes",
            processes=len(self.children),
            directory=str(self.directory),
        )
        try:
            await asyncio.gather(*(self._keep(child) for child in self.children))
        finally:
            self.stopped_at = time.monotonic()
        if self.failed is not None:
            return USAGE
        return 1 if self.failures() else 0

    def failures(self) -> list[str]:
        """``process 2: exit code 1`` for each process that did not stop cleanly when asked
        (one waiting to be restarted had nothing to stop)."""
        return [
            f"process {child.index}: {describe_exit(child.final)}"
            for child in self.children
            if child.final is not None and child.final != 0
        ]

    def stop(self) -> None:
        """The first call stops every child gracefully (SIGTERM), the second forces them
        (SIGTERM again: queued batches are dropped, done work is still committed), the
        third kills them."""
        self._signals += 1
        self._stopping.set()
        # The children are signalled before the line is logged: a log line that cannot be
        # written must not keep them running.
        if self._signals == 1:
            self._signal_all(signal.SIGTERM)
            log.info("stopping the worker processes gracefully; send the signal again to force")
        elif self._signals == 2:
            self._signal_all(signal.SIGTERM)
            log.warning("forcing the worker processes to stop; a third signal kills them")
        else:
            self._signal_all(signal.SIGKILL)
            log.warning("killing the worker processes")

    def _signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.pid is not None and child.process is not None:
                try:
                    child.process.send_signal(signum)
                except ProcessLookupError:  # it exited meanwhile; _keep sees it
                    pass

    async def _keep(self, child: Child) -> None:
        delay = self.backoff
        while not self.stopping:
            started = time.monotonic()
            process = child.process = await self._spawn(child)
            if self._stopping.is_set():  # stop() came while it was being started
                process.send_signal(signal.SIGTERM)
            code = await process.wait()
            child.exits.append(code)
            # Its live gauges (partitions held, queue depth) go; its counters stay summed.
            multiprocess.mark_process_dead(process.pid, str(self.metrics_dir))
            if self._stopping.is_set():
                child.final = code
                return
            if code == 0:  # it chose to stop (its stdout closed, a SIGTERM of its own)
                log.info("worker process stopped by itself; not restarting it", process=child.index)
                child.final = code
                return
            if code == USAGE:
                self.failed = f"worker process {child.index} refused its input (exit code 2)"
                log.error("worker process refused its input; stopping", process=child.index)
                self.stop()
                return
            if time.monotonic() - started >= self.stable_after:
                delay = self.backoff
            log.warning(
                "worker process died; restarting it",
                process=child.index,
                pid=process.pid,
                exit=describe_exit(code),
                restart_in=f"{delay:g} s",
            )
            child.restarts += 1
            try:
                await asyncio.wait_for(self._stopping.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, self.max_backoff)

    async def _spawn(self, child: Child) -> asyncio.subprocess.Process:
        env = {
            **self.env,
            INDEX_VAR: str(child.index),
            DIR_VAR: str(self.directory),
            METRICS_VAR: str(self.metrics_dir),
        }
        # The secrets wait in a pipe the child inherits (a few bytes: the pipe's buffer
        # holds them, so this write does not block).
        read, write = os.pipe()
        try:
            os.write(write, self._secrets)
            os.close(write)
            env[SECRETS_VAR] = str(read)
            # A session of its own: a terminal's Ctrl-C reaches the parent, which passes it
            # on once; otherwise each child would get it twice and force its stop.
            return await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
                pass_fds=(read,),
            )
        finally:
            os.close(read)

    async def aclose(self) -> None:
        """Kill what still runs (only after a failure in the parent) and remove the
        group's directory. Idempotent."""
        for child in self.children:
            process = child.process
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
