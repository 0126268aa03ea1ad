"""Apache Kafka itself for tests: a one-node KRaft broker (broker and controller in one JVM).

The broker's jars come from Maven Central through Maven (``tests/apache-kafka/pom.xml`` pins
the version) into ``~/.cache/flowkit-tests/kafka-<version>-<pom hash>/`` (``$FLOWKIT_KAFKA_CACHE``
moves it), once per machine. A log directory is formatted there too, once, with
``kafka.tools.StorageTool`` (and the SCRAM user below), and every broker starts on a copy
of it: ``java -cp 'jars/*' kafka.Kafka server.properties``, 512 MB of heap, on free loopback
ports, logging to ``kafka.log`` in its directory. The JVM maps the classes it loads at a
start from an archive beside the jars (class data sharing: a start takes seconds less); the
first session on a machine writes it when its broker stops (``class_archive``).

Listeners of every broker:

- ``bootstrap``: PLAINTEXT;
- ``sasl_bootstrap``: SASL_PLAINTEXT with SCRAM-SHA-512, user ``SCRAM_USER`` and password
  ``SCRAM_PASSWORD`` (``sasl_settings()`` gives the flowkit client settings);
- ``ssl_bootstrap``: SSL, with a certificate for ``localhost``/``127.0.0.1`` signed by a
  CA made for the session (``ca.ca_file``; ``ssl_settings()``);
- ``sasl_ssl_bootstrap``: SASL_SSL, the two together (``sasl_ssl_settings()``);
- ``oauth_bootstrap``: SASL_PLAINTEXT with OAUTHBEARER, accepting unsecured JWTs (``alg``
  ``none``, checked for form and lifetime only: ``unsecured_jwt()`` makes one;
  ``oauth_settings()``);
- ``mtls_bootstrap``: SSL that requires a client certificate signed by the session's CA
  (``mtls_settings()``: the CA's client certificate and its encrypted key).

Fixtures (Java 17+ and Maven are needed: without them the tests that use these fixtures are
skipped with the reason, except under ``CI=true``, where they fail):

``apache_kafka``
    The session's broker (an ``ApacheKafka``). Shared by every test: use unique topic and
    group names, or ``clean_apache_kafka``.
``clean_apache_kafka``
    The same broker, running when the test starts (started again if a test left it
    stopped), and emptied after the test: every topic and consumer group deleted. Tests
    with fixed topic names use it; it may ``stop()``, ``start()`` and ``restart()`` the
    broker (a restart keeps the log directory and ports, so data survives).
``fresh_apache_kafka``
    A broker of the test's own (a JVM start: seconds), for tests that need a broker nobody
    else has touched.

The broker params of the end-to-end tests (``make_driver`` in tests/conftest.py,
``transport_factory`` in tests/transports/conftest.py) use these; tests/README.md says which
suites run on which broker. ``FLOWKIT_TEST_KAFKA=host:port`` replaces the session's Tansu
(``kafka_bootstrap``), not this broker: the tests here need one they can restart.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.certificates import TestCA
from tests.local_servers import free_port, kill, listening, spawn, wait_ready

__all__ = [
    "SCRAM_PASSWORD",
    "SCRAM_USER",
    "ApacheKafka",
    "apache_kafka",
    "class_archive",
    "clean_apache_kafka",
    "fresh_apache_kafka",
    "kafka_jars",
    "kafka_version",
    "require_java",
    "unsecured_jwt",
]

HERE = Path(__file__).resolve().parent / "apache-kafka"
POM = HERE / "pom.xml"
LOG4J = HERE / "log4j2.properties"

SCRAM_USER = "flowkit"
SCRAM_PASSWORD = "flowkit-secret"

_START_DEADLINE = 180.0  # a JVM start on a loaded 2-core machine has taken 25 s
_FETCH_DEADLINE = 900.0
_ATTEMPTS = 4
_ARCHIVE_DEADLINE = 60.0  # a graceful stop that writes the class archive
_LISTENERS = ("PLAINTEXT", "CONTROLLER", "SASL_PLAINTEXT", "SSL", "SASL_SSL", "OAUTH", "MTLS")
_JVM_OPTIONS = [
    "-Xmx512m",
    "-Xms128m",
    "-XX:+UseSerialGC",  # one core's worth of broker: no parallel GC threads
    "-XX:TieredStopAtLevel=1",  # C1 only: a quicker start, and fast enough for tests
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
]
# Fast settings for a one-node test cluster; everything else is Kafka's default
# (auto.create.topics.enable=true, num.partitions=1, delete.topic.enable=true).
_BROKER_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": ",".join(f"{name}:{name}" for name in _LISTENERS)
    .replace("CONTROLLER:CONTROLLER", "CONTROLLER:PLAINTEXT")
    .replace("OAUTH:OAUTH", "OAUTH:SASL_PLAINTEXT")
    .replace("MTLS:MTLS", "MTLS:SSL"),
    "sasl.enabled.mechanisms": "SCRAM-SHA-512",
    # OAUTHBEARER with unsecured JWTs (alg "none"): Kafka's default login and validator
    # callback handlers for the mechanism, when no other is configured. The validator
    # checks the token's form and lifetime, not who signed it: enough to test the
    # clients' side (tokens from a provider or an OIDC endpoint, refusals, refreshing).
    "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
    "listener.name.oauth.oauthbearer.sasl.jaas.config": (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required"
        ' unsecuredLoginStringClaim_sub="broker";'
    ),
    **{
        f"listener.name.{name}.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
        for name in ("sasl_plaintext", "sasl_ssl")
    },
    "ssl.keystore.type": "PKCS12",
    "ssl.client.auth": "none",
    # The MTLS listener requires a client certificate the session's CA signed.
    "listener.name.mtls.ssl.client.auth": "required",
    "listener.name.mtls.ssl.truststore.type": "PEM",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # A restarted node re-registers with its own controller only once its previous
    # registration's session has expired: 9 s by default, 2 s here.
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    # The tests' clients use 2-3 s session timeouts (Kafka's minimum is 6 s).
    "group.min.session.timeout.ms": "500",
    # Transactions left open by a killed producer are aborted within a second of timing out.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    # Tests write records with fixed event times years in the past: Kafka's time-based
    # retention (7 days, checked 30 s after start, then every 5 min) would delete them
    # under a consumer that is still reading, which then resets to the log start, past
    # them. Keep every record for the life of the broker.
    "log.retention.ms": "-1",
}


def kafka_version() -> str:
    """The Apache Kafka version the pom pins."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ET.parse(POM).getroot().findtext("m:properties/m:kafka.version", namespaces=ns)
    assert version, f"{POM}: no kafka.version property"
    return version


def _cache_root() -> Path:
    override = os.environ.get("FLOWKIT_KAFKA_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flowkit-tests"


def require_java() -> None:
    """Skip the calling test when Java or Maven is missing, or fail it under ``CI=true``."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if not missing:
        return
    reason = (
        f"the Apache Kafka tests need Java 17+ and Maven ({' and '.join(missing)} not found "
        "on PATH); they fetch the broker's jars from Maven Central on first use"
    )
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)


def kafka_jars() -> Path:
    """The directory of the broker's jars, fetched through Maven on the first call on this
    machine (a lock keeps two sessions from fetching at once)."""
    pom_hash = hashlib.sha256(POM.read_bytes()).hexdigest()[:10]
    home = _cache_root() / f"kafka-{kafka_version()}-{pom_hash}"
    jars = home / "jars"
    if (home / "complete").exists():
        return jars
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "complete").exists():
            return jars
        staging = Path(tempfile.mkdtemp(prefix="jars-", dir=home))
        command = [
            "mvn",
            "--batch-mode",
            "--quiet",
            "--file",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_FETCH_DEADLINE, check=False
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(
                f"Maven did not fetch Apache Kafka's jars in {_FETCH_DEADLINE:.0f} s"
            ) from None
        if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            output = (done.stdout + done.stderr).strip()[-2000:]
            raise RuntimeError(f"Maven could not fetch Apache Kafka's jars:\n{output}")
        shutil.rmtree(jars, ignore_errors=True)
        staging.rename(jars)
        (home / "complete").write_text(" ".join(command) + "\n")
    return jars


def _cluster_id() -> str:
    # Kafka's Uuid.toString(): URL-safe base64 of 16 bytes, without padding.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _java(jars: Path, log_file: Path, main: str, *args: str) -> list[str]:
    return [
        "java",
        *_JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={LOG4J}",
        f"-Dkafka.test.log={log_file}",
        "-cp",
        f"{jars}/*",
        main,
        *args,
    ]


def _write_properties(path: Path, settings: dict[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))


def formatted_log_dir(jars: Path) -> Path:
    """A log directory formatted by ``StorageTool format`` (with the SCRAM user), kept
    beside the jars: every broker starts on a copy. It names no ports (the quorum's one
    voter is in ``controller.quorum.voters``, not on disk), so a copy suits any broker, and
    it is made again only when what it is formatted with changes."""
    properties = {
        **_BROKER_SETTINGS,
        "controller.quorum.voters": "1@127.0.0.1:9",
        "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:9",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    }
    scram = f"SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"
    key = hashlib.sha256(repr((sorted(properties.items()), scram)).encode()).hexdigest()[:10]
    home = jars.parent / f"formatted-{key}"
    if (home / "complete").exists():
        return home / "data"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "complete").exists():
            return home / "data"
        log_dir = home / "data"
        shutil.rmtree(log_dir, ignore_errors=True)
        _write_properties(home / "format.properties", {**properties, "log.dirs": str(log_dir)})
        command = _java(
            jars,
            home / "format.log",
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            _cluster_id(),
            "--config",
            str(home / "format.properties"),
            "--add-scram",
            scram,
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed:\n{done.stdout}{done.stderr}")
        (home / "complete").write_text(" ".join(command) + "\n")
    return log_dir


def class_archive(jars: Path) -> Path:
    """Where the JVM's archive of the broker's classes is kept (class data sharing, JDK 13+),
    for these jars and this ``java``: a broker maps its classes from it instead of loading
    them one by one, seconds of each start on a loaded machine. A JVM writes the archive
    only when it exits by itself: ``ApacheKafka.close()`` stops a broker started without
    one that way (once per machine), ``stop()`` never does."""
    java = shutil.which("java") or "java"
    key = hashlib.sha256(str(Path(java).resolve()).encode()).hexdigest()[:10]
    return jars.parent / f"classes-{key}.jsa"


class ApacheKafka:
    """One Apache Kafka broker (KRaft, broker and controller in one JVM) on 127.0.0.1::

        broker = ApacheKafka(tmp_path); broker.start()
        broker.bootstrap     # '127.0.0.1:40123'
        broker.restart()     # SIGKILL, then the same log directory and ports again

    Its files are in ``workdir``: ``data/`` (the log directory), ``server.properties``,
    ``kafka.log`` (the broker's log) and ``tls/`` (the session's CA and the broker's
    keystore).
    """

    def __init__(self, workdir: Path, jars: Path | None = None) -> None:
        self.workdir = workdir
        self.jars = jars
        self.data_dir = workdir / "data"
        self.log_path = workdir / "kafka.log"
        self.out_path = workdir / "kafka.out"
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.ca: TestCA | None = None
        self._dumping: Path | None = None  # where the running JVM writes its class archive

    # -- addresses ------------------------------------------------------------------------

    def _address(self, listener: str) -> str:
        assert self.ports, "broker not started"
        return f"127.0.0.1:{self.ports[listener]}"

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the PLAINTEXT listener."""
        return self._address("PLAINTEXT")

    @property
    def url(self) -> str:
        """``kafka://127.0.0.1:PORT`` for ``transport_from_url``."""
        return f"kafka://{self.bootstrap}"

    @property
    def sasl_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SASL_PLAINTEXT (SCRAM-SHA-512) listener."""
        return self._address("SASL_PLAINTEXT")

    @property
    def ssl_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SSL listener."""
        return self._address("SSL")

    @property
    def mtls_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SSL listener that requires a client certificate."""
        return self._address("MTLS")

    @property
    def oauth_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SASL_PLAINTEXT listener with OAUTHBEARER (unsecured
        JWTs: ``unsecured_jwt`` makes one)."""
        return self._address("OAUTH")

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SASL_SSL (SCRAM-SHA-512 over TLS) listener."""
        return self._address("SASL_SSL")

    def sasl_settings(self, password: str = SCRAM_PASSWORD) -> dict[str, Any]:
        """flowkit client settings for ``sasl_bootstrap``."""
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": SCRAM_USER,
            "sasl_plain_password": password,
        }

    def ssl_settings(self, cafile: Path | None = None) -> dict[str, Any]:
        """flowkit client settings for ``ssl_bootstrap`` (trusting ``cafile``, by default
        the CA that signed the broker's certificate)."""
        assert self.ca is not None, "broker not started"
        return {"security_protocol": "SSL", "ssl_cafile": str(cafile or self.ca.ca_file)}

    def mtls_settings(self, key_password: str | None = None) -> dict[str, Any]:
        """flowkit client settings for ``mtls_bootstrap``: the session CA's client
        certificate, its encrypted key and the key's password (by default the right one)."""
        assert self.ca is not None, "broker not started"
        return {
            **self.ssl_settings(),
            "ssl_certfile": str(self.ca.client_cert),
            "ssl_keyfile": str(self.ca.client_key),
            "ssl_key_password": key_password or self.ca.client_key_password,
        }

    def oauth_settings(self, **oauth: Any) -> dict[str, Any]:
        """flowkit client settings for ``oauth_bootstrap``, with the ``sasl_oauth_*``
        settings ``oauth`` gives (without the prefix: ``token_provider=...``)."""
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "OAUTHBEARER",
            **{f"sasl_oauth_{name}": value for name, value in oauth.items()},
        }

    def sasl_ssl_settings(self) -> dict[str, Any]:
        """flowkit client settings for ``sasl_ssl_bootstrap``."""
        return {**self.sasl_settings(), **self.ssl_settings(), "security_protocol": "SASL_SSL"}

    # -- lifecycle ------------------------------------------------------------------------

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the broker: on a copy of the formatted log directory and free ports the
        first time, on its own log directory and ports after that."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.jars is None:
            self.jars = kafka_jars()
        if self.ca is None:
            self.ca = TestCA.create(self.workdir / "tls")
        first = not self.ports
        errors: list[str] = []
        for _ in range(_ATTEMPTS):
            if first:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                shutil.copytree(formatted_log_dir(self.jars), self.data_dir)
                self.ports = {name: free_port() for name in _LISTENERS}
            error = self._spawn()
            if error is None:
                return
            errors.append(error)
            time.sleep(0.5)  # after a restart, the old sockets may linger for a moment
        raise RuntimeError("Apache Kafka did not start:\n" + "\n".join(errors))

    def _spawn(self) -> str | None:
        assert self.jars is not None and self.ca is not None
        properties = self.workdir / "server.properties"
        listeners = ",".join(f"{name}://{self._address(name)}" for name in _LISTENERS)
        advertised = ",".join(
            f"{name}://{self._address(name)}" for name in _LISTENERS if name != "CONTROLLER"
        )
        _write_properties(
            properties,
            {
                **_BROKER_SETTINGS,
                "controller.quorum.voters": f"1@{self._address('CONTROLLER')}",
                "listeners": listeners,
                "advertised.listeners": advertised,
                "log.dirs": str(self.data_dir),
                "ssl.keystore.location": str(self.ca.keystore),
                "ssl.keystore.password": self.ca.keystore_password,
                "ssl.key.password": self.ca.keystore_password,
                "listener.name.mtls.ssl.truststore.location": str(self.ca.ca_file),
            },
        )
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = _java(self.jars, self.log_path, "kafka.Kafka", str(properties))
        archive = class_archive(self.jars)
        if archive.exists():
            self._dumping = None
            command[1:1] = [f"-XX:SharedArchiveFile={archive}"]
        else:  # written at a graceful exit (close()), under a name of this JVM's own
            self._dumping = archive.with_name(f"{archive.stem}.{uuid.uuid4().hex}.tmp")
            command[1:1] = [f"-XX:ArchiveClassesAtExit={self._dumping}"]
        self.proc = spawn(command, self.out_path)
        port = self.ports["PLAINTEXT"]

        def ready() -> bool:
            return b"Kafka Server started" in self._log_since(log_start) and listening(port)

        if wait_ready(self.proc, ready, _START_DEADLINE, step=0.1):
            return None
        kill(self.proc)
        tail = self._log_since(log_start).decode(errors="replace")
        errors = [line for line in tail.splitlines() if " ERROR " in line or "Exception" in line]
        out = self.out_path.read_text(errors="replace")[-1000:] if self.out_path.exists() else ""
        return "\n".join(errors[-5:]) or out or f"not started within {_START_DEADLINE:.0f} s"

    def _log_since(self, start: int) -> bytes:
        if not self.log_path.exists():
            return b""
        with open(self.log_path, "rb") as f:
            f.seek(start)
            return f.read()

    def stop(self) -> None:
        """Kill the broker (SIGKILL): what it acknowledged is in its log directory."""
        kill(self.proc)

    def close(self) -> None:
        """Stop the broker for good: ``stop()``, unless it is writing the class archive
        (``class_archive``), which it does in a graceful exit (SIGTERM) within a deadline."""
        dumping, proc = self._dumping, self.proc
        if dumping is None or proc is None or proc.poll() is not None:
            self.stop()
            return
        assert self.jars is not None
        proc.terminate()
        try:
            proc.wait(timeout=_ARCHIVE_DEADLINE)
            exited = True
        except subprocess.TimeoutExpired:
            exited = False  # a half-written archive is not kept
        self.stop()  # reaps it (and kills it, if it is still shutting down)
        if exited and dumping.exists():
            os.replace(dumping, class_archive(self.jars))
        dumping.unlink(missing_ok=True)

    def restart(self) -> None:
        """Kill it, then start it again on the same log directory and ports."""
        self.stop()
        self.start()

    # -- isolation ------------------------------------------------------------------------

    def clean(self, deadline: float = 60.0) -> None:
        """Delete every topic but Kafka's own and every consumer group, so that the next
        test finds an empty broker. A group that still has members (a killed client whose
        session has not expired yet) is retried until ``deadline`` seconds pass."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        end = time.monotonic() + deadline
        topics = [t for t in admin.list_topics(timeout=deadline).topics if not t.startswith("__")]
        if topics:
            for future in admin.delete_topics(topics, operation_timeout=deadline).values():
                future.result()
        while True:
            listed = admin.list_consumer_groups(request_timeout=deadline).result()
            groups = [g.group_id for g in listed.valid]
            if not groups:
                return
            busy = []
            for group, future in admin.delete_consumer_groups(
                groups, request_timeout=deadline
            ).items():
                try:
                    future.result()
                except KafkaException as e:
                    if time.monotonic() > end:
                        raise RuntimeError(f"could not delete consumer group {group}: {e}") from e
                    busy.append(group)
            if not busy:
                return
            time.sleep(0.2)


def unsecured_jwt(subject: str = SCRAM_USER, lifetime: float = 3600.0, **claims: Any) -> str:
    """An unsecured JWT (``alg`` ``none``, no signature) for ``subject``, valid for
    ``lifetime`` seconds from now (negative: expired), as the OAUTHBEARER listener takes."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = time.time()
    payload = {"sub": subject, "iat": int(now), "exp": int(now + lifetime), **claims}
    return f"{part({'alg': 'none'})}.{part(payload)}."


def _start(workdir: Path) -> ApacheKafka:
    require_java()
    broker = ApacheKafka(workdir)
    broker.start()
    return broker


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """The session's Apache Kafka broker (module docstring)."""
    broker = _start(tmp_path_factory.mktemp("apache-kafka"))
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def clean_apache_kafka(apache_kafka: ApacheKafka) -> Iterator[ApacheKafka]:
    """The session's broker, running, and emptied of topics and groups after the test."""
    if not apache_kafka.running():
        apache_kafka.start()
    yield apache_kafka
    if not apache_kafka.running():
        apache_kafka.start()
    apache_kafka.clean()


@pytest.fixture
def fresh_apache_kafka(tmp_path: Path) -> Iterator[ApacheKafka]:
    """An Apache Kafka broker of this test's own."""
    broker = _start(tmp_path / "apache-kafka")
    try:
        yield broker
    finally:
        broker.stop()
