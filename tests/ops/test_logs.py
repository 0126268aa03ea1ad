"""Log lines and printed lines that cannot be written: dropped, never raised."""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Iterator

import pytest
import structlog
import structlog.testing

from flowkit.logs import GuardedStream, configure_logging


class Failing(io.StringIO):
    """A stream whose every write fails with ``error``."""

    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


@pytest.fixture
def readerless() -> Iterator[io.TextIOWrapper]:
    """A text stream on a pipe whose reader is gone."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w") as stream:
        yield stream


def test_a_pipe_whose_reader_is_gone_goes_to_dev_null(readerless: io.TextIOWrapper) -> None:
    calls: list[str] = []
    stream = GuardedStream(readerless, on_gone=lambda: calls.append("gone"))
    assert stream.write("a line\n") == 7
    stream.flush()
    assert stream.write("another line\n") == 13
    stream.flush()
    assert stream.gone and calls == ["gone"]
    # The descriptor itself now writes to /dev/null: so do the interpreter's last flush
    # and anything else that writes to it.
    assert os.path.samestat(os.fstat(readerless.fileno()), os.stat(os.devnull))
    readerless.write("straight to the descriptor\n")
    readerless.flush()


def test_a_closed_file_object_is_gone_too() -> None:
    closed = io.StringIO()
    closed.close()
    stream = GuardedStream(closed)
    assert stream.write("x") == 1
    stream.flush()
    assert stream.gone


def test_other_failures_drop_a_log_line_and_raise_for_output() -> None:
    full = Failing(OSError(errno.ENOSPC, "No space left on device"))
    logs = GuardedStream(full)
    assert logs.write("a log line\n") == 11
    assert not logs.gone  # the next line may pass
    output = GuardedStream(full, drop_others=False)
    with pytest.raises(OSError, match="No space left"):
        output.write("a result\n")
    assert not output.gone


def test_a_stream_the_interpreter_started_without_takes_every_write() -> None:
    stream = GuardedStream(None)
    assert stream.write("nowhere\n") == 8
    stream.flush()
    assert stream.gone and not stream.isatty()


def test_log_lines_to_a_broken_stderr_are_dropped(
    readerless: io.TextIOWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = structlog.get_config()
    kept = list(saved["processors"])  # (changed in place by configure_logging)
    monkeypatch.setattr("sys.stderr", readerless)
    try:
        configure_logging("info")
        log = structlog.get_logger("test")
        log.info("a line nobody reads")  # raised BrokenPipeError before
        log.warning("and another")
    finally:
        saved["processors"][:] = kept
        structlog.configure(**saved)
    assert os.path.samestat(os.fstat(readerless.fileno()), os.stat(os.devnull))


def test_a_second_configuration_reaches_the_loggers_cached_before_it() -> None:
    # The command line configures logging again in a process that may have logged
    # already (its tests run it in-process): loggers cached before keep the same list of
    # processors, so what captures or renders later reaches them too.
    saved = structlog.get_config()
    kept = list(saved["processors"])
    try:
        log = structlog.get_logger("cached-early")
        with structlog.testing.capture_logs():
            log.warning("a first use caches this logger")
        configure_logging("warning")
        with structlog.testing.capture_logs() as entries:
            log.warning("seen")
        assert [entry["event"] for entry in entries] == ["seen"]
    finally:
        saved["processors"][:] = kept
        structlog.configure(**saved)
