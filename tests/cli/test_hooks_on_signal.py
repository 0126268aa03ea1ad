"""Shutdown hooks run when `flowkit worker` gets SIGTERM, before the worker stops."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.cli.test_cli import Process, spawn  # noqa: F401 (the fixture)


def test_sigterm_runs_the_shutdown_hooks(spawn: Callable[..., Process]) -> None:  # noqa: F811
    worker = spawn("worker", "examples.word_count:app")
    worker.wait_for(lambda: "word count starting\n" in worker.out)
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0, "".join(worker.err)
    assert worker.out == ["word count starting\n", "tally: \n"]
    err = "".join(worker.err)
    assert "signal=SIGTERM" in err and "worker stopped" in err
    assert "Traceback" not in err
