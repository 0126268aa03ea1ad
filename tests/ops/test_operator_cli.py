"""`flowkit send`, `flowkit tables show` and `flowkit offsets` against a real broker."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from flowkit import SystemClock
from flowkit.cli import cli
from flowkit.cli.operator import parse_typed
from flowkit.errors import ConfigurationError
from flowkit.testing import TestDriver
from flowkit.transports.kafka import KafkaTransport
from tests.conftest import KAFKA_TEST_SETTINGS
from tests.kafka_broker import TansuBroker
from tests.ops import cli_app

APP = "tests.ops.cli_app:app"


async def flowkit(*args: str) -> Any:
    """The CLI in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


def offsets_of(output: str) -> dict[str, tuple[str, int, int]]:
    rows = {}
    for line in output.splitlines()[1:]:
        topic, partition, committed, end, lag = line.split()
        if topic == "clicks":
            rows[f"{topic}/{partition}"] = (committed, int(end), int(lag))
    return rows


def lag(output: str) -> int:
    return sum(lag for *_, lag in offsets_of(output).values())


@pytest.mark.kafka
async def test_send_tables_and_offsets(fresh_kafka: TansuBroker) -> None:
    url = f"kafka://{fresh_kafka.bootstrap}"
    sent = await flowkit("send", APP, "clicks", '{"user": "ann"}', "--key", "ann", "-b", url)
    assert sent.exit_code == 0, sent.output
    assert sent.output.startswith("sent to clicks/") and sent.output.strip().endswith("@0")
    bad = await flowkit("send", APP, "clicks", '{"usr": 1}', "-b", url)
    assert bad.exit_code == 2 and "is not a valid Click" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    for user in ("bob", "ann"):
        more = await flowkit(
            "send", APP, "clicks", json.dumps({"user": user}), "-k", user, "-b", url
        )
        assert more.exit_code == 0

    # A group that never ran: nothing committed, everything is lag.
    fresh = await flowkit("offsets", APP, "-b", url)
    assert fresh.exit_code == 0, fresh.output
    assert {committed for committed, *_ in offsets_of(fresh.stdout).values()} == {"-"}
    assert lag(fresh.stdout) == 3
    # Reset before the first start: skip the backlog, then take it back.
    reset = ("offsets", "reset", APP, "--yes")
    assert (await flowkit(*reset, "--to", "latest", "-b", url)).exit_code == 0
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 0
    earliest = await flowkit(*reset, "--to", "earliest", "-b", url)
    assert earliest.exit_code == 0, earliest.output
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 3

    transport = KafkaTransport([fresh_kafka.bootstrap], **KAFKA_TEST_SETTINGS)
    try:
        clock = SystemClock()  # the records carry the wall-clock time of `flowkit send`
        async with TestDriver(cli_app.app, transport=transport, settle=0.3, clock=clock) as driver:
            await driver.run_until_idle()
            alive = await flowkit(*reset, "--to", "earliest", "-b", url)
            assert alive.exit_code == 2 and "has live members" in alive.output
            assert len(alive.output.strip().splitlines()) == 1
    finally:
        await transport.aclose()

    shown = await flowkit("tables", "show", APP, "counts", "-b", url)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == ["ann\t2", "bob\t1"]
    one = await flowkit("tables", "show", APP, "counts", "ann", "--json", "-b", url)
    assert json.loads(one.stdout) == {"key": "ann", "value": 2}
    windows = await flowkit("tables", "show", APP, "per_window", "ann", "--json", "-b", url)
    assert [w["value"] for w in json.loads(windows.stdout)["windows"]] == [2]
    missing = await flowkit("tables", "show", APP, "counts", "zed", "-b", url)
    assert missing.exit_code == 1 and "has no key 'zed'" in missing.output

    done = (await flowkit("offsets", APP, "-b", url)).stdout
    rows = offsets_of(done)
    assert sum(end for _, end, _ in rows.values()) == 3 and lag(done) == 0, done
    await flowkit("send", APP, "clicks", '{"user": "cy"}', "-k", "cy", "-b", url)
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 1


def test_operator_commands_refuse_the_memory_broker() -> None:
    for args in (
        ["send", APP, "clicks", "{}"],
        ["tables", "show", APP, "counts"],
        ["offsets", APP],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, args
        assert "memory:// broker lives inside one worker process" in result.output


def test_a_bad_reset_target_is_one_line() -> None:
    result = CliRunner().invoke(
        cli, ["offsets", "reset", APP, "--to", "yesterday", "-b", "kafka://x:1"]
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        "Error: --to 'yesterday': use earliest, latest, ms since the epoch or an ISO 8601 time"
    )


@pytest.mark.parametrize("type_", [Any, list[Any], dict[str, Any]], ids=["Any", "list", "dict"])
def test_a_value_nested_too_deep_is_one_line(type_: Any) -> None:
    deep = "[" * 5_000 if type_ != dict[str, Any] else '{"a":' * 5_000
    with pytest.raises(ConfigurationError, match=r"VALUE .* is not JSON: RecursionError"):
        parse_typed(deep, type_, "VALUE")


@pytest.mark.kafka
@pytest.mark.parametrize("client", ["aiokafka", "rdkafka"])
async def test_offsets_show_and_reset_on_either_client(
    fresh_kafka: TansuBroker, client: str
) -> None:
    url = f"kafka://{fresh_kafka.bootstrap}?client={client}"
    for user in ("ann", "bob", "cy"):
        sent = await flowkit(
            "send", APP, "clicks", json.dumps({"user": user}), "-k", user, "-b", url
        )
        assert sent.exit_code == 0, sent.output
    fresh = await flowkit("offsets", APP, "-b", url)
    assert fresh.exit_code == 0, fresh.output
    assert lag(fresh.stdout) == 3

    dry = await flowkit("offsets", "reset", APP, "--to", "latest", "--dry-run", "-b", url)
    assert dry.exit_code == 0, dry.output
    assert "would reset" in dry.stderr and "clicks/" in dry.stdout
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 3  # nothing written
    # No terminal to ask on, no --yes: refused in one line, nothing written.
    unasked = await flowkit("offsets", "reset", APP, "--to", "latest", "-b", url)
    assert unasked.exit_code == 2
    assert unasked.output.strip().splitlines() == [
        "Error: offsets reset writes the group's offsets: pass --yes to confirm "
        "(or --dry-run to see them) when standard input is not a terminal"
    ]
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 3

    latest = await flowkit("offsets", "reset", APP, "--to", "latest", "--yes", "-b", url)
    assert latest.exit_code == 0, latest.output
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 0
    # A time before every record: all of them again.
    back = await flowkit("offsets", "reset", APP, "--to", "1000", "--yes", "-b", url)
    assert back.exit_code == 0, back.output
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 3


def _reset_on_a_terminal(url: str, answer: bytes) -> subprocess.CompletedProcess[bytes]:
    """``flowkit offsets reset`` with a terminal for standard input, answered ``answer``."""
    main, terminal = pty.openpty()
    try:
        os.write(main, answer)  # typed ahead: read when the question is asked
        return subprocess.run(
            [sys.executable, "-m", "flowkit.cli", "offsets", "reset", APP, "--to", "latest"],
            env={**os.environ, "FLOWKIT_BROKER": url},
            stdin=terminal,
            capture_output=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(terminal)
        os.close(main)


@pytest.mark.kafka
async def test_offsets_reset_asks_on_a_terminal_first(fresh_kafka: TansuBroker) -> None:
    url = f"kafka://{fresh_kafka.bootstrap}"
    for user in ("ann", "bob"):
        sent = await flowkit("send", APP, "clicks", json.dumps({"user": user}), "-b", url)
        assert sent.exit_code == 0, sent.output
    declined = await asyncio.to_thread(_reset_on_a_terminal, url, b"n\n")
    assert declined.returncode == 1, declined.stderr
    assert b"Commit these offsets for group opscli? [y/N]" in declined.stderr
    assert declined.stderr.strip().endswith(b"Error: nothing written")
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 2
    accepted = await asyncio.to_thread(_reset_on_a_terminal, url, b"y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert lag((await flowkit("offsets", APP, "-b", url)).stdout) == 0
