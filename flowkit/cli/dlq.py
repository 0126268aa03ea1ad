"""``flowkit dlq show`` and ``flowkit dlq replay``: an app's dead letters."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from .._printable import printable
from .._text import count
from ..app import App
from ..deadletter import DeadLetter, dead_letter_topic
from ..errors import ConfigurationError
from ..runtime.letters.replay import (
    Marks,
    mark_replayed,
    read_dead_letters,
    read_replayed,
    replay_dead_letters,
    replayed,
)
from ..transports import Transport, parse_broker_url
from .common import AppArg, BrokerOpt, errors
from .loader import load_app
from .operator import group_topics, open_transport

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
    show_traceback: Annotated[
        bool,
        typer.Option("--traceback", help="Print each letter's stored traceback below it."),
    ] = False,
) -> None:
    """Print APP's dead letters: when, stage, source, agent, error and a value preview."""
    with errors():
        the_app, url, name, filters = _dlq_args(app, broker, topic, where)
        letters = asyncio.run(_read_letters(open_transport(the_app, url), name))
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
        if show_traceback and letter.traceback:
            for line in letter.traceback.splitlines():
                typer.echo(f"        {printable(line)}")


@dlq.command("replay")
def dlq_replay(
    app: AppArg,
    broker: BrokerOpt = None,
    topic: TopicOpt = None,
    where: WhereOpt = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="TOPIC",
            help="Send them here instead of their source (a topic APP declares).",
        ),
    ] = None,
    skip_truncated: Annotated[
        bool,
        typer.Option(
            "--skip-truncated",
            help="Leave out dead letters whose value was cut to fit (else they stop the replay).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be sent; send nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Send again those already replayed, and to topics APP does not declare.",
        ),
    ] = False,
) -> None:
    """Send dead letters back to their source topic (or --to): the original key, value,
    headers and timestamp. Each replayed letter is marked, and skipped by the next replay."""
    with errors():
        the_app, url, name, filters = _dlq_args(app, broker, topic, where)
        declared = _replayable_topics(the_app)
        if to is not None and to not in declared and not force:
            raise ConfigurationError(
                f"--to {to!r}: app {the_app.name!r} declares no such topic "
                f"({', '.join(sorted(declared)) or 'none'}); --force sends there anyway"
            )

        async def read() -> tuple[list[DeadLetter], Marks]:
            transport = open_transport(the_app, url)
            try:
                return await read_dead_letters(transport, name), await read_replayed(
                    transport, name
                )
            finally:
                await transport.aclose()

        letters, marked = asyncio.run(read())
        plan = _plan(letters, marked, filters, to, declared, skip_truncated, force)
        for letter in plan.truncated:  # left out (--skip-truncated): where the whole one is
            typer.echo(f"skipped {_truncation(letter)}", err=True)
        if dry_run:
            for letter in plan.chosen:
                typer.echo(_would_send(letter, to))
        elif plan.chosen:
            asyncio.run(_replay(open_transport(the_app, url), name, plan.chosen, to))
    done = "would replay" if dry_run else "replayed"
    sent = len(plan.chosen)
    if where:
        sent_text = count(sent, "dead letter")
        summary = f"{done} {sent_text} matching {' '.join(where)} from {name}"
        summary += f" ({len(letters)} in all)"
    else:
        summary = f"{done} {sent} of {count(len(letters), 'dead letter')} from {name}"
    left = []
    if plan.replayed:
        left.append(f"{plan.replayed} already replayed (--force sends them again)")
    if plan.truncated:
        left.append(f"{len(plan.truncated)} truncated")
    if plan.nowhere:
        left.append(f"{plan.nowhere} with no source topic (--to sends them)")
    typer.echo(summary + (f"; skipped {', '.join(left)}" if left else ""))


class _Plan:
    """The letters a replay sends, and those it leaves out."""

    def __init__(self) -> None:
        self.chosen: list[DeadLetter] = []
        self.truncated: list[DeadLetter] = []
        self.replayed = 0  # marked as replayed by an earlier run
        self.nowhere = 0  # no source topic, and no --to


def _plan(
    letters: list[DeadLetter],
    marked: Marks,
    filters: dict[str, str],
    to: str | None,
    declared: set[str],
    skip_truncated: bool,
    force: bool,
) -> _Plan:
    plan = _Plan()
    for letter in letters:
        if not letter.matches(filters):
            continue
        if not force and replayed(letter, marked):
            plan.replayed += 1
        elif not (to or letter.source_topic):
            plan.nowhere += 1
        elif letter.truncated:
            plan.truncated.append(letter)
        else:
            plan.chosen.append(letter)
    if plan.truncated and not skip_truncated:
        first, more = plan.truncated[0], len(plan.truncated) - 1
        also = f" ({more} more truncated)" if more else ""
        raise ConfigurationError(
            f"not sent: {_truncation(first)}{also}; --skip-truncated replays the others"
        )
    if not force and to is None:
        for letter in plan.chosen:
            if letter.source_topic not in declared:
                raise ConfigurationError(
                    f"not sent: dead letter {_where(letter)} came from {letter.source_topic!r}, "
                    "a topic the app does not declare; --to TOPIC sends it to one it does, "
                    "--force sends it there anyway"
                )
    return plan


def _replayable_topics(app: App) -> set[str]:
    """Where a replay may send without --force: the app's declared topics and those its
    group reads (windowed tables' repartition topics too)."""
    return {*app.topics, *group_topics(app)}


def _where(letter: DeadLetter) -> str:
    m = letter.message
    return f"{m.topic}/{m.partition}@{m.offset}"


def _truncation(letter: DeadLetter) -> str:
    kept = len(letter.message.value or b"")
    sha = f", sha256 {letter.value_sha256}" if letter.value_sha256 else ""
    return printable(
        f"dead letter {_where(letter)} holds {kept} of its value's {letter.original_size} "
        f"bytes (cut to fit); the whole record is {letter.source_topic}/"
        f"{letter.source_partition}@{letter.source_offset}{sha}, readable while that topic's "
        "retention keeps it"
    )


def _would_send(letter: DeadLetter, to: str | None) -> str:
    m = letter.message
    key = "<none>" if m.key is None else m.key[:40].decode(errors="backslashreplace")
    value = "<none>" if m.value is None else f"{len(m.value)} bytes"
    names = ",".join(name for name, _ in letter.original_headers) or "-"
    return printable(
        f"would send {_where(letter)} -> {to or letter.source_topic}  key={key}  "
        f"value={value}  timestamp={letter.source_timestamp}  headers={names}"
    )


async def _replay(
    transport: Transport, dlq_topic: str, letters: list[DeadLetter], to: str | None
) -> None:
    try:
        await replay_dead_letters(transport, letters, to)
        # Marked once the broker has every replayed record: a replay cut short before
        # this sends them again next time (at least once, never lost).
        await mark_replayed(transport, dlq_topic, letters, int(time.time() * 1000))
    finally:
        await transport.aclose()


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


async def _read_letters(transport: Transport, topic: str) -> list[DeadLetter]:
    try:
        return await read_dead_letters(transport, topic)
    finally:
        await transport.aclose()
