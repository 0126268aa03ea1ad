"""``flowkit dlq show`` and ``flowkit dlq replay``: an app's dead letters."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from .._text import count
from ..app import App
from ..deadletter import DeadLetter, dead_letter_topic
from ..errors import ConfigurationError
from ..runtime.deadletters import read_dead_letters, replay_dead_letters
from ..transports import parse_broker_url, transport_from_url
from .common import AppArg, BrokerOpt, errors
from .loader import load_app

__all__ = ["dlq"]

dlq = typer.Typer(
    name="dlq",
    help="Inspect and replay dead letters.",
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)

TopicOpt = Annotated[
    str | None,
    typer.Option(
        "--topic",
        metavar="TOPIC",
        help="The dead-letter topic (default: <app>-dlq).",
        show_default=False,
    ),
]
WhereOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        metavar="FIELD=VALUE",
        help="Only dead letters with stage, error, agent, topic or partition equal to VALUE "
        "(repeat for AND).",
        show_default=False,
    ),
]


@dlq.command("show")
def dlq_show(
    app: AppArg,
    broker: BrokerOpt = None,
    topic: TopicOpt = None,
    where: WhereOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, metavar="N", help="Newest N.")] = 20,
) -> None:
    """Print APP's dead letters: when, stage, source, agent, error and a value preview."""
    with errors():
        _, url, name, filters = _dlq_args(app, broker, topic, where)
        letters = asyncio.run(_read_letters(url, name))
    matching = [letter for letter in letters if letter.matches(filters)]
    chosen = matching[-limit:]
    if where:  # say how many matched, not only how many there are
        matched = count(len(matching), "dead letter")
        typer.echo(
            f"{len(chosen)} of {matched} matching {' '.join(where)} in {name}"
            f" ({len(letters)} in all)"
        )
    else:
        typer.echo(f"{len(chosen)} of {count(len(letters), 'dead letter')} in {name}")
    for letter in chosen:
        typer.echo(letter.describe())


@dlq.command("replay")
def dlq_replay(
    app: AppArg,
    broker: BrokerOpt = None,
    topic: TopicOpt = None,
    where: WhereOpt = None,
    to: Annotated[
        str | None,
        typer.Option("--to", metavar="TOPIC", help="Send them here instead of their source."),
    ] = None,
) -> None:
    """Send dead letters back to their source topic (or --to), unchanged."""
    with errors():
        _, url, name, filters = _dlq_args(app, broker, topic, where)

        async def run() -> tuple[int, int]:
            transport = transport_from_url(url)
            try:
                letters = await read_dead_letters(transport, name)
                chosen = [letter for letter in letters if letter.matches(filters)]
                return await replay_dead_letters(transport, chosen, to), len(letters)
            finally:
                await transport.aclose()

        sent, total = asyncio.run(run())
    if where:
        sent_text = count(sent, "dead letter")
        typer.echo(f"replayed {sent_text} matching {' '.join(where)} from {name} ({total} in all)")
    else:
        typer.echo(f"replayed {sent} of {count(total, 'dead letter')} from {name}")


def _dlq_args(
    app: str, broker: str | None, topic: str | None, where: list[str] | None
) -> tuple[App, str, str, dict[str, str]]:
    the_app = load_app(app)
    url = broker or the_app.broker
    parse_broker_url(url)
    if url.startswith("memory://"):
        raise ConfigurationError(
            "a memory:// broker lives inside one worker process; dead letters can be read "
            "from Kafka (--broker kafka://...) or in tests with TestDriver.dead_letters()"
        )
    filters: dict[str, str] = {}
    for item in where or []:
        field, sep, value = item.partition("=")
        if not sep or field not in ("stage", "error", "agent", "topic", "partition"):
            raise ConfigurationError(
                f"--where {item!r}: use FIELD=VALUE with FIELD one of stage, error, agent, "
                "topic, partition"
            )
        filters[field] = value
    return the_app, url, topic or dead_letter_topic(the_app.name), filters


async def _read_letters(url: str, topic: str) -> list[DeadLetter]:
    transport = transport_from_url(url)
    try:
        return await read_dead_letters(transport, topic)
    finally:
        await transport.aclose()
