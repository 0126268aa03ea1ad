"""``flowkit offsets APP`` and ``flowkit offsets reset APP --to ...``: the group's offsets.

The group is the app's name; its topics are those the app's agents read and its windowed
tables' repartition topics. The end of each partition is the high watermark of a fetch
(see ``flowkit.transports.kafka.groups``). A reset commits new offsets for the group, and
is refused while any member of the group is alive: a running worker would overwrite them
at its next commit.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ..app import App
from ..errors import ConfigurationError
from ..records import TopicPartition
from .common import FAILED, AppArg, BrokerOpt, errors, fail
from .operator import group_topics, kafka_app, open_transport

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
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the new offsets; write nothing.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Write without asking first.")] = False,
) -> None:
    """Commit new offsets for APP's group, after asking (--yes: without); refused while a
    member of the group is alive."""
    with errors():
        the_app, url = kafka_app(app, broker, "resetting offsets")
        target = _target(to)
        if not (dry_run or yes or sys.stdin.isatty()):
            raise ConfigurationError(
                "offsets reset writes the group's offsets: pass --yes to confirm (or --dry-run "
                "to see them) when standard input is not a terminal"
            )
        plan = asyncio.run(_plan(url, the_app, target))
    for tp, (old, new) in sorted(plan.items()):
        typer.echo(f"{tp.topic}/{tp.partition}: {'-' if old is None else old} -> {new}")
    group = the_app.name
    if dry_run:
        typer.echo(f"group {group}: would reset {len(plan)} partitions to {to}", err=True)
        return
    if not yes and not typer.confirm(f"Commit these offsets for group {group}?", err=True):
        fail("nothing written", FAILED)
    with errors():
        asyncio.run(_commit(url, the_app, {tp: new for tp, (_, new) in plan.items()}))
    typer.echo(f"group {group}: {len(plan)} partitions reset to {to}", err=True)


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
    transport: Any = open_transport(app, url)
    log_ends = _groups(transport).log_ends
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


async def _plan(
    url: str, app: App, target: str | int
) -> dict[TopicPartition, tuple[int | None, int]]:
    """Each partition's committed offset and the one ``target`` names."""
    transport: Any = open_transport(app, url)
    try:
        groups = _groups(transport)
        await _no_live_members(transport, app)
        tps = await _partitions(transport, app)
        ends = await groups.log_ends(transport, tps)
        if target == "earliest":
            wanted = {tp: ends[tp][0] for tp in tps}
        elif target == "latest":
            wanted = {tp: ends[tp][1] for tp in tps}
        else:
            found = await groups.offsets_at(transport, tps, int(target))
            wanted = {tp: _or(found[tp], ends[tp][1]) for tp in tps}
        group = transport.consumer(group_id=app.name, client_id="flowkit-offsets")
        await group.start()
        try:
            group.assign(tps)
            return {tp: (await group.committed(tp), wanted[tp]) for tp in tps}
        finally:
            await group.aclose()
    finally:
        await transport.aclose()


async def _commit(url: str, app: App, offsets: dict[TopicPartition, int]) -> None:
    transport: Any = open_transport(app, url)
    try:
        await _no_live_members(transport, app)  # asked again: one may have started since
        group = transport.consumer(group_id=app.name, client_id="flowkit-offsets")
        await group.start()
        try:
            group.assign(list(offsets))
            await group.commit(offsets)
        finally:
            await group.aclose()
    finally:
        await transport.aclose()


async def _no_live_members(transport: Any, app: App) -> None:
    state = await _groups(transport).group_state(transport, app.name)
    if state not in ("Empty", "Dead"):
        raise ConfigurationError(
            f"group {app.name!r} has live members (state {state}): stop every worker of "
            "the app first, or they overwrite the reset at their next commit"
        )


def _groups(transport: Any) -> Any:
    """The module that sees a group from outside over ``transport``'s Kafka client."""
    from ..transports.kafka import KafkaTransport, groups

    if isinstance(transport, KafkaTransport):
        return groups
    from ..transports.rdkafka import groups as over_rdkafka

    return over_rdkafka


def _or(offset: int | None, end: int) -> int:
    return end if offset is None else offset
