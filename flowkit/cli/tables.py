"""``flowkit tables show APP TABLE [KEY]``: a table as its changelog holds it.

The changelog is read from its start to its end (the high watermark a fetch reports) into
a fresh copy of the table's state, the way a worker recovers it, with no consumer group:
the app's workers can run meanwhile, and nothing is committed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
import typer

from .._printable import printable, printable_json
from ..errors import ConfigurationError
from ..state import WindowedTable
from ..transports import Transport, read_topic
from .common import FAILED, AppArg, BrokerOpt, errors, fail
from .operator import kafka_app, open_transport, parse_typed

__all__ = ["tables"]

tables = typer.Typer(
    name="tables",
    help="Read an app's tables from their changelogs.",
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)


@tables.command("show")
def show(
    app: AppArg,
    table: Annotated[str, typer.Argument(metavar="TABLE", help="A table APP declares.")],
    key: Annotated[
        str | None,
        typer.Argument(
            metavar="[KEY]", help="One key (JSON unless keys are str).", show_default=False
        ),
    ] = None,
    broker: BrokerOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print TABLE's keys and values (windowed tables: each key's windows), or one KEY."""
    with errors():
        the_app, url = kafka_app(app, broker, "reading a table")
        declared = the_app.tables.get(table)
        if declared is None:
            known = ", ".join(sorted(the_app.tables)) or "none"
            raise ConfigurationError(f"app {the_app.name!r} declares no table {table!r} ({known})")
        wanted = None if key is None else parse_typed(key, declared.key_type, "KEY")
        store = asyncio.run(_load(open_transport(the_app, url), declared))
    rows = _rows(declared, store, wanted)
    if key is not None and not rows:
        fail(f"table {table!r} has no key {key!r}", FAILED)
    if as_json:
        typer.echo(as_json_text(rows if key is None else rows[0]))
        return
    for line in text_lines(rows):
        typer.echo(line)
    if key is None:
        typer.echo(f"{len(rows)} keys in {table}", err=True)


def text_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row: the key, a tab, the value (or windows) as JSON; any character
    that is not printable escaped, so a key or value cannot write to the terminal."""
    return [
        f"{printable(str(row['key']))}\t{as_json_text(row.get('windows', row.get('value')))}"
        for row in rows
    ]


def as_json_text(value: Any) -> str:
    """``value`` as JSON, with each character that is not printable as a ``\\u`` escape
    (the JSON still decodes to ``value``)."""
    return printable_json(msgspec.json.encode(value).decode())


async def _load(transport: Transport, table: Any) -> Any:
    store = table.new_store(lambda: int(time.time() * 1000))
    try:
        await read_topic(
            transport,
            table.changelog_topic,
            lambda tp, messages: store.apply_changelog(tp.partition, messages),
            client_id="flowkit-tables",
        )
    finally:
        await transport.aclose()
    return store


def _rows(table: Any, store: Any, wanted: Any) -> list[dict[str, Any]]:
    keys = [wanted] if wanted is not None else sorted(store, key=repr)
    rows: list[dict[str, Any]] = []
    for k in keys:
        if isinstance(table, WindowedTable):
            windows = store.windows(k)
            if windows:
                listed = [{"start": w.start, "end": w.end, "value": v} for w, v in windows.items()]
                rows.append({"key": k, "windows": listed})
        else:
            missing = object()
            value = store.get(k, missing)
            if value is not missing:
                rows.append({"key": k, "value": value})
    return rows
