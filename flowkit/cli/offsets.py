"""``flowkit offsets APP`` and ``flowkit offsets reset APP --to ...``: the group's offsets.

The group is the app's name; its topics are those the app's agents read and its windowed
tables' repartition topics. The end of each partition is the high watermark of a fetch
(see ``flowkit.transports.kafka.groups``). A reset commits new offsets for the group, and
is refused while any member of the group is alive: a running worker would overwrite them
at its next commit.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ..app import App
from ..errors import ConfigurationError
from ..records import TopicPartition
from ..transports import transport_from_url
from .common import AppArg, BrokerOpt, errors
from .operator import group_topics, kafka_app

__all__ = ["offsets"]


class _ShowByDefault(TyperGroup):
    """``flowkit offsets APP`` runs ``show``; ``flowkit offsets reset APP`` runs reset."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


offsets = typer.Typer(
    name="offsets",
    cls=_ShowByDefault,
    help="Show or reset the committed offsets of an app's consumer group.",
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)


@offsets.command("show")
def show(app: AppArg, broker: BrokerOpt = None) -> None:
    """Committed offset, end offset and lag per partition of APP's group."""
    with errors():
        the_app, url = kafka_app(app, broker, "reading offsets")
        rows = asyncio.run(_offsets(url, the_app))
    width = max([len("topic"), *(len(tp.topic) for tp, *_ in rows)])
    typer.echo(f"{'topic':<{width}}  partition  committed      end      lag")
    total = 0
    for tp, committed, end in rows:
        lag = end - (committed if committed is not None else 0)
        total += lag
        shown = "-" if committed is None else str(committed)
        typer.echo(f"{tp.topic:<{width}}  {tp.partition:>9}  {shown:>9}  {end:>7}  {lag:>7}")
    typer.echo(f"group {the_app.name}: lag {total} records", err=True)


@offsets.command("reset")
def reset(
    app: AppArg,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="earliest|latest|TIME",
            help="earliest, latest, or a time (ms since the epoch, or ISO 8601).",
        ),
    ],
    broker: BrokerOpt = None,
) -> None:
    """Commit new offsets for APP's group; refused while a member of the group is alive."""
    with errors():
        the_app, url = kafka_app(app, broker, "resetting offsets")
        target = _target(to)
        changed = asyncio.run(_reset(url, the_app, target))
    for tp, offset in sorted(changed.items()):
        typer.echo(f"{tp.topic}/{tp.partition} -> {offset}")
    typer.echo(f"group {the_app.name}: {len(changed)} partitions reset to {to}", err=True)


def _target(to: str) -> str | int:
    if to in ("earliest", "latest"):
        return to
    if to.isdigit():
        return int(to)
    try:
        return int(datetime.fromisoformat(to).timestamp() * 1000)
    except ValueError:
        raise ConfigurationError(
            f"--to {to!r}: use earliest, latest, ms since the epoch or an ISO 8601 time"
        ) from None


async def _partitions(transport: Any, app: App) -> list[TopicPartition]:
    tps: list[TopicPartition] = []
    for topic in group_topics(app):
        count = await transport.partition_count(topic) or 0
        tps.extend(TopicPartition(topic, p) for p in range(count))
    return tps


async def _offsets(url: str, app: App) -> list[tuple[TopicPartition, int | None, int]]:
    from ..transports.kafka.groups import log_ends

    transport: Any = transport_from_url(url)
    try:
        tps = await _partitions(transport, app)
        ends = await log_ends(transport, tps)
        group = transport.consumer(group_id=app.name, client_id="flowkit-offsets")
        await group.start()
        try:
            group.assign(tps)
            committed = {tp: await group.committed(tp) for tp in tps}
        finally:
            await group.aclose()
        return [(tp, committed[tp], ends[tp][1]) for tp in tps]
    finally:
        await transport.aclose()


async def _reset(url: str, app: App, target: str | int) -> dict[TopicPartition, int]:
    from ..transports.kafka.groups import group_state, log_ends, offsets_at

    transport: Any = transport_from_url(url)
    try:
        state = await group_state(transport, app.name)
        if state not in ("Empty", "Dead"):
            raise ConfigurationError(
                f"group {app.name!r} has live members (state {state}): stop every worker of "
                "the app first, or they overwrite the reset at their next commit"
            )
        tps = await _partitions(transport, app)
        ends = await log_ends(transport, tps)
        if target == "earliest":
            wanted = {tp: ends[tp][0] for tp in tps}
        elif target == "latest":
            wanted = {tp: ends[tp][1] for tp in tps}
        else:
            found = await offsets_at(transport, tps, int(target))
            wanted = {tp: _or(found[tp], ends[tp][1]) for tp in tps}
        group = transport.consumer(group_id=app.name, client_id="flowkit-offsets")
        await group.start()
        try:
            group.assign(tps)
            await group.commit(wanted)
        finally:
            await group.aclose()
        return wanted
    finally:
        await transport.aclose()


def _or(offset: int | None, end: int) -> int:
    return end if offset is None else offset
