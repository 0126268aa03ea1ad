"""One line that names the cause and the option: the messages a first hour with flowkit meets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flowkit
from flowkit.cli import cli
from flowkit.testing import TestDriver

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("FLOWKIT_BROKER", raising=False)


def _error(*args: str) -> tuple[int, str]:
    result = runner.invoke(cli, list(args))
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("spec", "module"),
    [
        ("examples/clickstream.py:app", "examples.clickstream:app"),
        ("./orders.py:app", "orders:app"),
        ("orders.py:app", "orders:app"),
    ],
)
def test_a_file_path_is_answered_with_the_module_to_give(spec: str, module: str) -> None:
    code, err = _error("graph", spec)
    assert code == 2
    assert err.count("\n") == 1 and err.endswith(f"name the module, not its file: {module}\n")


def test_a_web_host_that_does_not_resolve_is_named_with_its_option() -> None:
    code, err = _error(
        "worker", "examples.clickstream:app", "--web-port", "9", "--web-host", "nohost.invalid"
    )
    assert code == 2
    assert err.startswith("Error: --web-host 'nohost.invalid' does not resolve (")
    assert err.count("\n") == 1


def test_a_web_port_in_use_is_named_with_its_option() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _error("worker", "examples.clickstream:app", "--web-port", str(port))
    assert code == 2
    assert (
        err
        == f"Error: cannot serve on 127.0.0.1:{port} (Address already in use); check --web-port\n"
    )


def test_a_broker_host_that_does_not_resolve_fails_at_once_in_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "flowkit.cli", "worker", "examples.clickstream:app"),
            *("--broker", "kafka://nohost.invalid:9092?connect_timeout=60"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,  # the connect timeout is 60 s: finishing at all shows it did not wait
    )
    assert done.returncode == 1
    # No "worker stopped" line: the worker never started.
    assert done.stderr == (
        "Error: worker failed: BrokerUnavailable: the Kafka broker host 'nohost.invalid' does"
        " not resolve (Name or service not known); check the broker URL\n"
    )


async def test_the_summary_counts_in_the_singular_too() -> None:
    app = flowkit.App("one")
    numbers = app.topic("numbers", value_type=int, partitions=1)

    @app.agent(numbers)
    async def take(stream: flowkit.Stream[int]) -> None:
        async for _ in stream:
            pass

    async with TestDriver(app) as driver:
        await driver.send(numbers, 1)
        await driver.run_until_idle()
    assert driver.worker.summary().startswith("processed 1 record in ")


def test_help_shows_plain_placeholders() -> None:
    result = runner.invoke(cli, ["worker", "--help"])
    assert "Usage: flowkit worker [OPTIONS] APP\n" in result.stdout
    for noise in ("{APP}", "<str>", "<int range>"):
        assert noise not in result.stdout
    assert "--web-port PORT" in result.stdout and "--web-host HOST" in result.stdout


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_processes_must_be_a_whole_number_or_auto(value: str) -> None:
    code, err = _error("worker", "examples.clickstream:app", "--processes", value)
    assert code == 2
    assert err == (
        f"Error: --processes {value!r}: give a whole number of at least 1, or auto (one per core)\n"
    )


@pytest.mark.parametrize("value", ["2", "8"])
def test_processes_on_the_memory_broker_is_one_line(value: str) -> None:
    code, err = _error(
        "worker", "examples.clickstream:app", "--broker", "memory://", "--processes", value
    )
    assert code == 2
    assert err.startswith(f"Error: --processes {value}: the memory:// broker lives inside one")
    assert err.count("\n") == 1
