"""No secret in any output: every CLI command that takes a broker URL, started so that it
fails (credentials before the host, a malformed URL, no broker, unreadable TLS files, an
OIDC token endpoint nobody serves), with secrets in the URL's user part and in its
settings, on both Kafka clients. All of its output, stdout and stderr, the log lines in
both formats included (and those of the worker processes under ``--processes 2``), is
searched for every secret.
"""

from __future__ import annotations

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


def _run(args: list[str]) -> tuple[int | None, str]:
    """Run ``flowkit ARGS``: its exit code (None if it ran on and was stopped) and all
    it wrote. A worker group runs until each of its processes has died once (their
    output is in by then) or it ends by itself, within a deadline."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FLOWKIT_BROKER", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowkit.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
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

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    died.wait(DEADLINE)
    code: int | None = None
    if ended.is_set():
        code = proc.wait(timeout=30)
    else:
        proc.send_signal(signal.SIGTERM)  # a group restarting its processes: stop it
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    reader.join(timeout=30)
    proc.stdout.close()
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
def test_no_secret_in_the_output_of_a_failing_start(client: str) -> None:
    runs = [
        (case, args)
        for case, url in _failing_urls(client).items()
        for args in _commands(url, client)
    ]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda run: _run(run[1]), runs))
    leaks, silent = [], []
    for (case, args), (code, out) in zip(runs, results, strict=True):
        what = f"{case}: flowkit {' '.join(args[:2])}"
        if code == 0 or (code is not None and "Error" not in out):
            silent.append(f"{what} exited {code}:\n{out}")
        if found := [secret for secret in SECRETS if secret in out]:
            leaks.append(f"{what} printed {found}:\n{out}")
    assert not leaks, "\n\n".join(leaks)
    assert not silent, "\n\n".join(silent)
