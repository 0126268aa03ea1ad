"""`flowkit dlq show` and `flowkit dlq replay` against a real broker, and the web endpoint."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import pytest
from typer.testing import CliRunner

import flowkit
from flowkit.cli import cli
from flowkit.deadletter import dead_letter_headers, fit_dead_letter
from flowkit.records import Message
from flowkit.testing import TestDriver
from flowkit.transports.kafka import KafkaTransport
from tests.conftest import KAFKA_TEST_SETTINGS
from tests.kafka.apps import dlq_app
from tests.kafka.conftest import ON_TANSU, KafkaServer

pytestmark = pytest.mark.kafka


class _Runner:
    """CliRunner in a thread: the CLI runs its own event loop."""

    async def invoke(self, *args: Any) -> Any:
        return await asyncio.to_thread(CliRunner().invoke, *args)


@ON_TANSU
async def test_show_and_replay_dead_letters(kafka_server: KafkaServer) -> None:
    url = f"kafka://{kafka_server.bootstrap}"
    transport = KafkaTransport([kafka_server.bootstrap], **KAFKA_TEST_SETTINGS)
    try:
        async with TestDriver(dlq_app.app, transport=transport, settle=0.3) as driver:
            for n in range(6):
                await driver.send(dlq_app.numbers, n, key=f"k{n}", headers=(("trace", b"t"),))
            await driver.run_until_idle()
    finally:
        await transport.aclose()
    runner = _Runner()
    shown = await runner.invoke(
        cli, ["dlq", "show", "tests.kafka.apps.dlq_app:app", "--broker", url]
    )
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == "3 of 3 dead letters in dlqtest-dlq"
    assert all("ValueError" in line and "evens_only" in line for line in lines[1:])
    assert [line.split("value=")[1] for line in lines[1:]] == ["1", "3", "5"]
    traced = await runner.invoke(
        cli, ["dlq", "show", "tests.kafka.apps.dlq_app:app", "--broker", url, "--traceback"]
    )
    assert traced.exit_code == 0, traced.output
    assert traced.output.count("        Traceback (most recent call last):") == 3
    assert "in evens_only" in traced.output and "        ValueError: 1 is odd" in traced.output
    only = await runner.invoke(
        cli,
        [
            "dlq",
            "show",
            "tests.kafka.apps.dlq_app:app",
            "--broker",
            url,
            "--where",
            "partition=0",
            "--where",
            "stage=process",
            "-n",
            "1",
        ],
    )
    on_0 = sum(" dlq-numbers/0@" in line for line in lines[1:])  # how many match
    matched = f"{on_0} dead letter{'' if on_0 == 1 else 's'}"
    assert only.output.splitlines()[0] == (
        f"{min(on_0, 1)} of {matched} matching partition=0 stage=process in dlqtest-dlq (3 in all)"
    )
    bad = await runner.invoke(
        cli, ["dlq", "show", "tests.kafka.apps.dlq_app:app", "--broker", url, "--where", "x"]
    )
    assert bad.exit_code == 2 and "FIELD=VALUE" in bad.output

    replay = ["dlq", "replay", "tests.kafka.apps.dlq_app:app", "--broker", url]
    undeclared = await runner.invoke(cli, [*replay, "--to", "replayed"])
    assert undeclared.exit_code == 2
    assert undeclared.output.startswith("Error: --to 'replayed': app 'dlqtest' declares no")
    replayed = await runner.invoke(cli, [*replay, "--to", "replayed", "--force"])
    assert replayed.exit_code == 0, replayed.output
    assert replayed.output.strip() == "replayed 3 of 3 dead letters from dlqtest-dlq"
    app = flowkit.App("reader")
    transport = KafkaTransport([kafka_server.bootstrap], **KAFKA_TEST_SETTINGS)
    try:
        messages = await TestDriver(app, transport=transport).messages("replayed")
    finally:
        await transport.aclose()
    assert sorted(m.value for m in messages) == [b"1", b"3", b"5"]
    # The original key and headers come back; the flowkit.* failure headers do not.
    assert {m.key for m in messages} == {b"k1", b"k3", b"k5"}
    assert all(m.headers == (("trace", b"t"),) for m in messages)


# A record's own headers, flowkit.* names among them: all of them are the record's.
OWN = (
    ("trace", b"t"),
    ("flowkit.trace", b"mine"),
    ("flowkit.value.truncated", b"true"),
    ("flowkit.source.topic", b"elsewhere"),
)


@ON_TANSU
@pytest.mark.parametrize("client", ["aiokafka", "rdkafka"])
async def test_replay_keeps_the_record_refuses_a_cut_one_and_runs_once(
    kafka_server: KafkaServer, client: str
) -> None:
    url = f"kafka://{kafka_server.bootstrap}?client={client}"
    transport = KafkaTransport([kafka_server.bootstrap], **KAFKA_TEST_SETTINGS)
    try:
        async with TestDriver(dlq_app.app, transport=transport, settle=0.3) as driver:
            for n in (1, 2, 3):
                await driver.send(
                    dlq_app.numbers, n, key=f"k{n}", headers=OWN, timestamp_ms=1_600_000_000_000 + n
                )
            await driver.run_until_idle()
            # A letter whose value was cut to fit, as a worker writes one when the record
            # and its headers are over the producer's limit.
            whole = b"7" * 10_026
            source = Message("dlq-numbers", 0, 41, 1_600_000_000_009, b"k9", whole, OWN)
            headers = dead_letter_headers(
                source,
                ValueError("big"),
                stage="process",
                agent="evens_only",
                attempts=1,
                failed_at_ms=1_700_000_000_000,
            )
            cut, headers = fit_dead_letter(b"k9", whole, headers, 3_000)
            assert cut is not None and len(cut) < 3_000
            await driver.send_raw("dlqtest-dlq", cut, key=b"k9", headers=headers)
            await driver.run_until_idle()
            before = len(await driver.messages(dlq_app.numbers))
    finally:
        await transport.aclose()
    runner = _Runner()
    app = "tests.kafka.apps.dlq_app:app"
    shown = await runner.invoke(cli, ["dlq", "show", app, "--broker", url])
    assert shown.exit_code == 0, shown.output
    marked = [line for line in shown.output.splitlines()[1:] if "truncated" in line]
    assert len(marked) == 1 and f"(truncated: {len(cut)} of 10026 bytes)" in marked[0]

    replay = ["dlq", "replay", app, "--broker", url]
    refused = await runner.invoke(cli, replay)
    assert refused.exit_code == 2
    (line,) = refused.output.splitlines()
    assert f"holds {len(cut)} of its value's 10026 bytes" in line
    assert "the whole record is dlq-numbers/0@41" in line and "--skip-truncated" in line

    dry = await runner.invoke(cli, [*replay, "--skip-truncated", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    would = [line for line in dry.stdout.splitlines() if line.startswith("would send ")]
    assert len(would) == 2 and all("-> dlq-numbers" in line for line in would)
    assert "timestamp=1600000000001" in would[0]
    assert dry.stdout.splitlines()[-1].startswith("would replay 2 of 3 dead letters")
    assert "skipped dead letter dlqtest-dlq/0@" in dry.stderr

    done = await runner.invoke(cli, [*replay, "--skip-truncated"])
    assert done.exit_code == 0, done.output
    assert (
        done.stdout.strip() == "replayed 2 of 3 dead letters from dlqtest-dlq; skipped 1 truncated"
    )
    again = await runner.invoke(cli, [*replay, "--skip-truncated"])
    assert again.stdout.strip() == (
        "replayed 0 of 3 dead letters from dlqtest-dlq; skipped 2 already replayed "
        "(--force sends them again), 1 truncated"
    )
    forced = await runner.invoke(cli, [*replay, "--skip-truncated", "--force"])
    assert forced.stdout.strip().startswith("replayed 2 of 3 dead letters")

    reader = KafkaTransport([kafka_server.bootstrap], **KAFKA_TEST_SETTINGS)
    try:
        messages = await TestDriver(flowkit.App("reader"), transport=reader).messages("dlq-numbers")
    finally:
        await reader.aclose()
    assert len(messages) == before + 4  # two letters, replayed twice (once with --force)
    replays = [m for m in messages if m.key in (b"k1", b"k3")]
    assert len(replays) == 2 + 4  # the originals, and each one replayed twice
    assert all(m.headers == OWN for m in replays)
    assert {(m.key, m.value, m.timestamp) for m in replays} == {
        (b"k1", b"1", 1_600_000_000_001),
        (b"k3", b"3", 1_600_000_000_003),
    }


def test_dlq_on_the_memory_broker_is_a_clear_error() -> None:
    result = CliRunner().invoke(cli, ["dlq", "show", "tests.kafka.apps.dlq_app:app"])
    assert result.exit_code == 2
    assert "memory:// broker lives inside one worker process" in result.output


async def test_the_web_endpoint_serves_metrics_readiness_and_graph() -> None:
    worker = flowkit.Worker(dlq_app.app, web_port=0)
    async with worker:
        assert worker.web is not None
        base = f"http://127.0.0.1:{worker.web.port}"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        for _ in range(100):
            if worker.ready:
                break
            await asyncio.sleep(0.02)
        status, body = await asyncio.to_thread(get, "/ready")
        assert (status, body) == (200, '{"ready": true, "app": "dlqtest"}')
        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and "flowkit_assigned_partitions 1.0" in body
        status, body = await asyncio.to_thread(get, "/graph")
        assert status == 200 and '"agent:evens_only"' in body
        status, _ = await asyncio.to_thread(get, "/nothing")
        assert status == 404
