"""``flowkit`` with standard streams it cannot write: closed descriptors (``2>&-``,
``>&-``) and pipes whose reader is gone (``| head -4``, a log shipper that died).

A log line, a printed line, the summary or an error line that cannot be written is lost;
it never fails a record, never keeps a worker from stopping on a signal, and never changes
the exit status. (tests/kafka/test_closed_streams.py checks that such stops commit.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

import pytest

from tests.cli.test_cli import CLICKSTREAM, REPO
from tests.tracebacks import crashes

DEADLINE = 30.0  # seconds for a worker to exit once it has a reason to
PAGE_COUNT = re.compile(r"\S+ +\d+ views\n")


def readerless_pipe() -> int:
    """The writing end of a pipe whose reader is already gone."""
    read, write = os.pipe()
    os.close(read)
    return write


class Child:
    """``python -m flowkit.cli ARGS``, started as a shell does (``sh -c 'exec ...
    REDIRECTIONS'``); the lines of each pipe it has are read as they come."""

    def __init__(
        self, *args: str, redirections: str = "", stdout: int = -1, stderr: int = -1
    ) -> None:
        env = {k: v for k, v in os.environ.items() if k != "FLOWKIT_BROKER"}
        env["PYTHONUNBUFFERED"] = "1"
        argv = ["sh", "-c", f'exec "$@" {redirections}', "sh"]
        argv += [sys.executable, "-m", "flowkit.cli", *args]
        self.popen = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
        )
        for fd in (stdout, stderr):
            if fd >= 0:
                os.close(fd)  # the child has its copy
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers: list[threading.Thread] = []
        for pipe, lines in ((self.popen.stdout, self.out), (self.popen.stderr, self.err)):
            if pipe is not None:
                reader = threading.Thread(target=_drain, args=(pipe, lines), daemon=True)
                reader.start()
                self._readers.append(reader)

    def until(self, ready: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
        end = time.monotonic() + deadline
        while not ready():
            if self.popen.poll() is not None:
                time.sleep(0.1)  # the readers catch up
                if ready():
                    return
                pytest.fail(f"exited ({self.popen.returncode}) before {what}:\n{self.text}")
            if time.monotonic() > end:
                pytest.fail(f"no {what} after {deadline} s:\n{self.text}")
            time.sleep(0.05)

    def exit_code(self, deadline: float = DEADLINE) -> int:
        try:
            code = self.popen.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {deadline} s later:\n{self.text}")
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    @property
    def text(self) -> str:
        return "".join(self.out + self.err)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


def _drain(pipe: IO[bytes], lines: list[str]) -> None:
    with pipe:
        for line in pipe:
            lines.append(line.decode(errors="replace"))


@pytest.fixture
def start() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def run(*args: str, **options: object) -> Child:
        child = Child(*args, **options)  # type: ignore[arg-type]
        started.append(child)
        return child

    yield run
    for child in started:
        child.kill()


SIGNALS = pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)


@SIGNALS
def test_a_worker_with_stderr_closed_stops_on_a_signal(
    start: Callable[..., Child], signum: signal.Signals
) -> None:
    worker = start("worker", CLICKSTREAM, redirections="2>&-")
    worker.until(lambda: len(worker.out) >= 3, "page counts")
    worker.popen.send_signal(signum)
    assert worker.exit_code() == 0
    assert all(PAGE_COUNT.fullmatch(line) for line in worker.out), worker.out


@SIGNALS
def test_a_worker_whose_stderr_reader_is_gone_stops_on_a_signal(
    start: Callable[..., Child], signum: signal.Signals
) -> None:
    # A log shipper that died: every log line, the signal's own and the summary fail.
    worker = start("worker", CLICKSTREAM, stderr=readerless_pipe())
    worker.until(lambda: len(worker.out) >= 3, "page counts")
    worker.popen.send_signal(signum)
    assert worker.exit_code() == 0
    assert all(PAGE_COUNT.fullmatch(line) for line in worker.out), worker.out


def test_a_worker_piped_into_head_with_its_log_stops_on_ctrl_c(
    start: Callable[..., Child],
) -> None:
    # `flowkit worker APP 2>&1 | head -4`, then Ctrl-C: its output stops it, or the signal
    # does (whichever comes first); either way it ends, and cleanly.
    read, write = os.pipe()
    worker = start("worker", CLICKSTREAM, redirections="2>&1", stdout=write)
    with os.fdopen(read, "rb") as head:
        lines = [head.readline() for _ in range(4)]
    assert all(lines), lines
    worker.popen.send_signal(signal.SIGINT)
    assert worker.exit_code() == 0


def test_a_worker_piped_into_head_with_its_log_stops_by_itself(
    start: Callable[..., Child],
) -> None:
    # The same without the Ctrl-C: the stop that the closed output asks for is not lost
    # to the log line that says so.
    read, write = os.pipe()
    worker = start("worker", CLICKSTREAM, redirections="2>&1", stdout=write)
    with os.fdopen(read, "rb") as head:
        lines = [head.readline() for _ in range(4)]
    assert all(lines), lines
    assert worker.exit_code() == 0


def test_a_worker_with_stdout_closed_fails_no_record(start: Callable[..., Child]) -> None:
    # `>&-`: what the agents print goes nowhere; it does not fail their records.
    worker = start("worker", "tests.cli.apps.print_app:app", redirections=">&-")
    worker.until(lambda: "printed 19\n" in worker.err, "the last number printed")
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.exit_code() == 0, worker.text
    assert "record failed" not in worker.text
    assert not crashes(worker.text)


@pytest.mark.parametrize(
    "args", [["graph", "examples.ysb:app"], ["--version"]], ids=["graph", "version"]
)
def test_a_command_whose_stdout_reader_is_gone_exits_quietly(
    start: Callable[..., Child], args: list[str]
) -> None:
    command = start(*args, stdout=readerless_pipe())
    assert command.exit_code() == 0
    assert command.err == []
