"""Mistakes in an app, and out-of-range options, as the command line shows them: one
``Error:`` line each, exit code 2, no traceback. Run as real processes.

The apps live in ``apps/``: ``bad_sink_app`` declares a sink that is a number,
``echo_name_app`` calls ``stream.echo("evens")`` (a name, not a topic) in its agent, and
``kafka_app`` names a Kafka broker that nothing listens on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
SINK = (
    "Error: agent 'double': sink must be a topic, a topic name, an agent, a Sink or a "
    "function, not int 42 (at tests/cli/apps/bad_sink_app.py:11)"
)


def flowkit(*args: str) -> tuple[int, list[str], list[str]]:
    """Run ``python -m flowkit.cli ARGS`` to its end: (exit code, stdout, stderr lines)."""
    env = {k: v for k, v in os.environ.items() if k != "FLOWKIT_BROKER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "flowkit.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()


@pytest.mark.parametrize("command", ["graph --check", "graph", "worker"])
def test_a_bad_declaration_is_refused_in_one_line_at_its_own_line(command: str) -> None:
    code, out, err = flowkit(*command.split(), "bad_sink_app:app")
    assert (code, out, err) == (2, [], [SINK.replace("/", os.sep)])


def test_graph_check_refuses_the_apps_own_broker_url() -> None:
    code, out, err = flowkit("graph", "ok_app:bad_broker", "--check")
    assert (code, out, len(err)) == (2, [], 1), err
    assert err[0].startswith("Error: unknown broker scheme 'amqp'"), err


def test_an_operator_called_wrongly_stops_the_worker_in_one_line() -> None:
    code, out, err = flowkit("worker", "echo_name_app:app", "--log-level", "warning")
    assert code == 2  # bad input: a process group does not start it again
    assert out == []
    assert err[-1] == (
        "Error: agent 'copy': stream.echo() takes topics declared with app.topic(), not str 'evens'"
    )
    assert not any("Traceback" in line or "restarting" in line for line in err), err


NOT_THERE = "is not one of them"
INVALID = "Error: Invalid value for '--partition' / '-p': "


@pytest.mark.parametrize(
    ("topic", "partition", "message"),
    [
        ("orders", "9", f"Error: topic 'orders' has 4 partitions (0-3); --partition 9 {NOT_THERE}"),
        ("orders", "4", f"Error: topic 'orders' has 4 partitions (0-3); --partition 4 {NOT_THERE}"),
        ("one", "1", f"Error: topic 'one' has 1 partition (0); --partition 1 {NOT_THERE}"),
        ("orders", "-1", f"{INVALID}Input should be greater than or equal to 0"),
        ("orders", "x", f"{INVALID}Input should be a valid integer"),
    ],
    ids=["9 of 4", "4 of 4", "1 of 1", "negative", "not a number"],
)
def test_send_to_a_partition_the_topic_does_not_have(
    topic: str, partition: str, message: str
) -> None:
    # Refused before any broker is asked: nothing listens at the app's address.
    code, out, err = flowkit("send", "kafka_app:app", topic, "5", "--partition", partition)
    assert (code, out, len(err)) == (2, [], 1), err
    assert err[0].startswith(message), err


def test_dev_broker_on_an_address_not_of_this_machine() -> None:
    code, out, err = flowkit("dev-broker", "--host", "no-such-host.invalid", "--port", "0")
    assert code == 2 and out == []
    assert len(err) == 1 and err[0].startswith("Error: cannot listen on --host 'no-such-host"), err
