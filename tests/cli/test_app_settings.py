"""Every command that talks to the broker uses the Kafka settings declared on the App
(``App(client_settings=...)``), as a worker does: an app whose security settings are
incomplete is refused with the same one line by each, before anything connects."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flowkit.cli import cli

APP = "tests.cli.apps.secured_app:app"
REFUSAL = "Error: security_protocol=SASL_PLAINTEXT needs sasl_plain_username/password"


@pytest.mark.parametrize(
    "args",
    [
        ["topics", APP],
        ["send", APP, "orders", "1"],
        ["dlq", "show", APP],
        ["dlq", "replay", APP, "--dry-run"],
        ["offsets", "show", APP],
        ["offsets", "reset", APP, "--to", "earliest", "--yes"],
        ["tables", "show", APP, "seen"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_commands_use_the_apps_client_settings(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args, env={"FLOWKIT_BROKER": None})
    assert result.output.strip() == REFUSAL, result.output
    assert result.exit_code == 2
