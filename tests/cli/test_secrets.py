"""No secret in any output: every CLI command that takes a broker URL, started so that it
fails (credentials before the host, a malformed URL, no broker, unreadable TLS files, an
OIDC token endpoint nobody serves), with secrets in the URL's user part and in its
settings, on both Kafka clients. All of its output, stdout and stderr, the log lines in
both formats included (and those of the worker processes under ``--processes 2``), is
searched for every secret.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO
from urllib.parse import urlencode

import pytest

REPO = Path(__file__).resolve().parents[2]
APP = "tests.kafka.apps.counts_app:app"

IN_USER = "user-part-secret-4821"
SASL_PASSWORD = "sasl-secret-9137"
KEY_PASSWORD = "key-secret-5526"
CLIENT_SECRET = "client-secret-7703"
SECRETS = (IN_USER, SASL_PASSWORD, KEY_PASSWORD, CLIENT_SECRET)

DEADLINE = 60.0  # seconds a command may take to fail
# A worker group restarts a process that died; its line says so once the process's own
# output is written.
RESTARTING = "worker process died; restarting it"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commands(url: str, client: str) -> list[list[str]]:
    broker = ["--broker", url]
    commands = [
        *(["worker", APP, *broker, "--log-format", fmt] for fmt in ("console", "json")),
        ["worker", APP, *broker, "--processes", "2", "--log-format", "json"],
        ["topics", APP, *broker],
        ["send", APP, "count-items", '{"key": "a", "seq": 1}', *broker],
        ["dlq", "show", APP, *broker],
        ["offsets", "show", APP, *broker],
    ]
    if client != "aiokafka":
        # Each command is a Python start of its own: the second client runs one command
        # per way of using it (consumer, producer, admin, worker, process group).
        return commands
    return [
        *commands,
        ["worker", APP, *broker, "--processes", "2", "--log-format", "console"],
        ["offsets", "reset", APP, "--to", "earliest", *broker],
        ["tables", "show", APP, "seen", *broker],
    ]


# Each command runs in a process of its own, forked from one that has already imported
# flowkit's command line and both Kafka clients (most of a start's CPU, and the same for
# every command): from there each runs as ``flowkit ARGS`` does, in a session of its own,
# with its own logging, output and exit code. A worker group starts its processes itself,
# as always.
_FORK_SERVER = """
import json, os, select, sys
import aiokafka, confluent_kafka
import flowkit.transports.kafka, flowkit.transports.rdkafka
import flowkit.cli

def run(args, out):
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    sys.argv = ["flowkit", *args]
    flowkit.cli.main()  # exits (SystemExit, or a traceback and 1), as `flowkit ARGS` does
    sys.exit(0)

pending = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.05)
    if ready:
        data = os.read(0, 65536)
        if not data:
            break
        pending += data
        while b"\\n" in pending:
            line, pending = pending.split(b"\\n", 1)
            ident, args, fifo = json.loads(line)
            out = os.open(fifo, os.O_WRONLY)  # the test holds its other end open
            pid = os.fork()
            if pid == 0:
                run(args, out)
            os.close(out)
            print(json.dumps(["started", ident, pid]), flush=True)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        print(json.dumps(["exited", pid, os.waitstatus_to_exitcode(status)]), flush=True)
"""


class _Starter:
    """Starts ``flowkit ARGS`` processes from the fork server. Each is known by the number
    ``start`` returns (a pid may be reused once its process is gone); ``wait`` gives its
    exit code (negative: the signal that ended it)."""

    def __init__(self, directory: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("FLOWKIT_BROKER", None)
        self.directory = directory
        self.server = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lock = threading.Lock()
        self.pids: dict[int, int] = {}  # number -> pid
        self.running: dict[int, int] = {}  # pid -> number, until it exits
        self.codes: dict[int, int] = {}  # number -> exit code
        self.changed = threading.Condition(self.lock)
        self.count = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.server.stdout is not None
        for line in self.server.stdout:
            kind, key, value = json.loads(line)
            with self.changed:
                if kind == "started":
                    self.pids[key] = value
                    self.running[value] = key
                else:
                    self.codes[self.running.pop(key)] = value
                self.changed.notify_all()

    def start(self, args: list[str]) -> tuple[int, IO[str]]:
        """Start ``flowkit ARGS``: its number and its output (stdout and stderr)."""
        with self.lock:
            self.count += 1
            ident = self.count
        fifo = self.directory / f"out-{ident}"
        os.mkfifo(fifo)
        # Open before the server does (a FIFO's first open waits for the other end), and
        # read only once the process holds the writing end: then its end is the end of
        # the output.
        read_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        with self.lock:
            assert self.server.stdin is not None
            self.server.stdin.write(json.dumps([ident, args, str(fifo)]) + "\n")
            self.server.stdin.flush()
        with self.changed:
            assert self.changed.wait_for(lambda: ident in self.pids, 30), "not started"
        os.set_blocking(read_end, True)
        return ident, open(read_end, errors="replace")

    def signal(self, ident: int, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the process (``group``: to its session's process group),
        unless it has exited."""
        with self.lock:
            if ident not in self.codes:
                (os.killpg if group else os.kill)(self.pids[ident], signum)

    def wait(self, ident: int, timeout: float) -> int:
        with self.changed:
            if not self.changed.wait_for(lambda: ident in self.codes, timeout):
                raise subprocess.TimeoutExpired(f"flowkit command {ident}", timeout)
            return self.codes[ident]

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self.reader.join(timeout=30)
        assert self.server.stdout is not None
        self.server.stdout.close()


def _run(starter: _Starter, args: list[str]) -> tuple[int | None, str]:
    """Run ``flowkit ARGS``: its exit code (None if it ran on and was stopped) and all
    it wrote. A worker group runs until each of its processes has died once (their
    output is in by then) or it ends by itself, within a deadline."""
    ident, stdout = starter.start(args)
    processes = int(args[args.index("--processes") + 1]) if "--processes" in args else 0
    lines: list[str] = []
    died, ended = threading.Event(), threading.Event()

    def read(stdout: IO[str]) -> None:
        restarts = 0
        for line in stdout:
            lines.append(line)
            restarts += RESTARTING in line
            if processes and restarts >= processes:
                died.set()
        ended.set()  # the end of its output: it exits
        died.set()

    reader = threading.Thread(target=read, args=(stdout,), daemon=True)
    reader.start()
    died.wait(DEADLINE)
    code: int | None = None
    if ended.is_set():
        code = starter.wait(ident, timeout=30)
    else:
        starter.signal(ident, signal.SIGTERM)  # a group restarting its processes: stop it
        try:
            starter.wait(ident, timeout=30)
        except subprocess.TimeoutExpired:
            starter.signal(ident, signal.SIGKILL, group=True)
            starter.wait(ident, timeout=30)
    reader.join(timeout=30)
    stdout.close()
    return code, "".join(lines)


def _failing_urls(client: str) -> dict[str, str]:
    port, idp = _closed_port(), _closed_port()
    sasl = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "shop",
        "sasl_plain_password": SASL_PASSWORD,
    }
    oauth = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_endpoint_url": f"http://127.0.0.1:{idp}/token",
        "sasl_oauth_client_id": "shop",
        "sasl_oauth_client_secret": CLIENT_SECRET,
    }
    tls = {
        "security_protocol": "SSL",
        "ssl_cafile": str(REPO / "no-such-ca.pem"),
        "ssl_certfile": str(REPO / "no-such-client.pem"),
        "ssl_key_password": KEY_PASSWORD,
    }
    every = {
        "sasl_plain_password": SASL_PASSWORD,
        "ssl_key_password": KEY_PASSWORD,
        "sasl_oauth_client_secret": CLIENT_SECRET,
    }
    common = {"client": client, "connect_timeout": 1}
    # A URL refused before a client is chosen is tried once, under the default client.
    refused = {
        "user part": f"kafka://shop:{IN_USER}@127.0.0.1:{port}?{urlencode(every)}",
        "malformed": f"kafka://127.0.0.1:x?{urlencode(every)}",
    }
    return {
        **(refused if client == "aiokafka" else {}),
        "no broker, SCRAM": f"kafka://127.0.0.1:{port}?{urlencode({**sasl, **common})}",
        "no broker, OIDC": f"kafka://127.0.0.1:{port}?{urlencode({**oauth, **common})}",
        "TLS files": f"kafka://127.0.0.1:{port}?{urlencode({**tls, **common})}",
    }


@pytest.mark.parametrize("client", ["aiokafka", "rdkafka"])
def test_no_secret_in_the_output_of_a_failing_start(client: str, tmp_path: Path) -> None:
    runs = [
        (case, args)
        for case, url in _failing_urls(client).items()
        for args in _commands(url, client)
    ]
    starter = _Starter(tmp_path)
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(lambda run: _run(starter, run[1]), runs))
    finally:
        starter.close()
    leaks, silent = [], []
    for (case, args), (code, out) in zip(runs, results, strict=True):
        what = f"{case}: flowkit {' '.join(args[:2])}"
        if code == 0 or (code is not None and "Error" not in out):
            silent.append(f"{what} exited {code}:\n{out}")
        if found := [secret for secret in SECRETS if secret in out]:
            leaks.append(f"{what} printed {found}:\n{out}")
    assert not leaks, "\n\n".join(leaks)
    assert not silent, "\n\n".join(silent)
