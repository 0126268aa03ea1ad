"""The ``flowkit`` command: ``flowkit worker APP``, ``flowkit graph APP``, ``flowkit topics APP``.

Thin on purpose: it loads the app, then calls the runtime or the renderers. Bad input is
one ``Error: ...`` line on stderr and exit code 2; a worker that dies is one line and 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import structlog
import typer
from typer.core import TyperGroup

from .. import __version__
from .._text import count
from ..app import check_standby_replicas
from ..errors import (
    ConfigurationError,
    DefinitionError,
    FlowkitError,
    TransactionAborted,
)
from ..logs import configure_logging
from ..rendering import render
from ..runtime import Worker, required_topics
from ..runtime.web.settings import TOKEN_VAR, WebLimits, WebToken
from ..transports import Transport, parse_broker_url, redact
from .addresses import check_web_address
from .common import FAILED, USAGE, AppArg, BrokerOpt
from .common import describe as _describe
from .common import echo_error as _echo_error
from .common import errors as _errors
from .common import fail as _fail
from .devbroker import dev_broker
from .dlq import dlq
from .loader import load_app
from .offsets import offsets
from .operator import open_transport
from .placeholders import plain_arguments
from .processes import (
    child_broker,
    child_index,
    child_token,
    parse_processes,
    run_group,
    serve_child,
)
from .send import send
from .stdio import stop_when_stdout_closes
from .tables import tables

__all__ = ["cli"]

log = structlog.get_logger("flowkit.cli")

IDLE_HINT = 5.0  # seconds without a record on the embedded broker before saying why


class _Group(TyperGroup):
    """Prints click's usage errors as one ``Error: ...`` line, like our own errors."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        plain_arguments(self)
        if not standalone_mode:
            return super().main(
                args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra
            )
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as exc:  # click's usage errors (typer vendors click)
            # typer validates choices with pydantic, whose "Value error, " adds nothing.
            _echo_error(exc.format_message().replace("Value error, ", ""))
            sys.exit(exc.exit_code)
        except typer.Abort:
            _echo_error("aborted")
            sys.exit(FAILED)
        sys.exit(code if isinstance(code, int) else 0)


cli = typer.Typer(
    name="flowkit",
    cls=_Group,
    help="Run and inspect flowkit stream-processing apps.",
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"flowkit {__version__}")
        raise typer.Exit()


@cli.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Show the version and exit.",
        ),
    ] = False,
) -> None:
    """Run and inspect flowkit stream-processing apps."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@cli.command()
def worker(
    app: AppArg,
    broker: BrokerOpt = None,
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"],
        typer.Option("--log-level", "-l", help="Log level."),
    ] = "info",
    log_format: Annotated[
        Literal["console", "json"],
        typer.Option("--log-format", help="Log lines for people or as JSON."),
    ] = "console",
    web_port: Annotated[
        int | None,
        typer.Option(
            "--web-port",
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve the live page, /metrics, /health, /ready, /graph and /tables on this port.",
            show_default=False,
        ),
    ] = None,
    web_host: Annotated[
        str,
        typer.Option("--web-host", metavar="HOST", help="The address --web-port listens on."),
    ] = "127.0.0.1",
    web_token: Annotated[
        str | None,
        typer.Option(
            "--web-token",
            envvar=TOKEN_VAR,
            metavar="TOKEN",
            help="Require 'Authorization: Bearer TOKEN' on every route but /health and "
            f"/ready (prefer the {TOKEN_VAR} variable: a command line is visible to all).",
            show_default=False,
            show_envvar=True,
        ),
    ] = None,
    web_allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--web-allow-host",
            metavar="NAME",
            help="A host name the endpoint answers to (Host header), besides the loopback "
            "names on a loopback address; repeat for more; * for any.",
            show_default=False,
        ),
    ] = None,
    web_max_connections: Annotated[
        int,
        typer.Option(
            "--web-max-connections",
            min=1,
            metavar="N",
            help="Connections the endpoint serves at once; more are answered 503 and closed.",
        ),
    ] = WebLimits.max_connections,
    web_header_timeout: Annotated[
        float,
        typer.Option(
            "--web-header-timeout",
            min=0.001,
            metavar="SECONDS",
            help="Time a connection has to send a request's headers (and to stay idle).",
        ),
    ] = WebLimits.header_timeout,
    web_rate: Annotated[
        float,
        typer.Option(
            "--web-rate",
            min=0.001,
            metavar="N",
            help="Requests per second the endpoint starts (/health and /ready aside).",
        ),
    ] = WebLimits.rate,
    processes: Annotated[
        str | None,
        typer.Option(
            "--processes",
            "-p",
            metavar="N|auto",
            help="Run N worker processes (auto: one per core) in one consumer group under "
            "this one, which restarts those that die (Kafka only).",
            show_default=False,
        ),
    ] = None,
    processing_guarantee: Annotated[
        Literal["at_least_once", "exactly_once"] | None,
        typer.Option(
            "--processing-guarantee",
            help="at_least_once, or exactly_once (Kafka transactions; Apache Kafka only). "
            "Default: the app's (at_least_once unless it says otherwise).",
            show_default=False,
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir",
            metavar="DIR",
            help="Where tables keep local state (the rocksdb:// store; snapshots of the "
            "memory store). Default: the app's data_dir, else ./flowkit-data for rocksdb://.",
            show_default=False,
        ),
    ] = None,
    standby_replicas: Annotated[
        int | None,
        typer.Option(
            "--standby-replicas",
            metavar="N",
            help="1: keep warm copies of the table partitions other workers own, so a "
            "takeover replays only the gap; 0: none. Default: the app's standby_replicas.",
            show_default=False,
        ),
    ] = None,
    fail_fast: Annotated[
        bool,
        typer.Option(
            "--fail-fast",
            help="Stop at the first record that fails, with its traceback, instead of "
            "dead-lettering it (for development; one process).",
        ),
    ] = False,
) -> None:
    """Run APP until Ctrl+C (or SIGTERM): once to stop gracefully, twice to force."""
    with _errors():
        the_app = load_app(app)
        if child_index() is not None:  # a process of a group: its parent says where
            broker = child_broker() or broker
        url = broker or the_app.broker
        parse_broker_url(url)  # a bad URL fails here, before anything starts
        wanted = parse_processes(processes, url) if processes is not None else 1
        if fail_fast and wanted > 1:
            _fail("--fail-fast stops at the first failure: run it without --processes", USAGE)
        if web_port:  # (0 picks a free port: nothing to check)
            check_web_address(web_host, web_port)
        token = WebToken(web_token) if web_token else None
        if standby_replicas is not None:
            check_standby_replicas(standby_replicas, "--standby-replicas")
        limits = WebLimits(
            max_connections=web_max_connections,
            header_timeout=web_header_timeout,
            rate=web_rate,
        )
        if child_index() is not None:  # a process of a group
            token = child_token()  # from its parent, over a pipe (if it has one)
            # Only its parent asks it, behind the group's one gate (the parent's).
            limits = dataclasses.replace(limits, gate=False)
        configure_logging(log_level, log_format)
        the_graph = the_app.graph()
        if child_index() is None and not the_graph.check():  # (problems: the worker says)
            for warning in the_graph.warnings():  # a likely mistake, such as a misspelt name
                log.warning(warning)  # (a group's parent says it once for all its processes)
        if wanted > 1:
            code, summary, failed = run_group(
                app,
                url,
                wanted,
                log_level=log_level,
                log_format=log_format,
                web_host=web_host,
                web_port=web_port,
                web_token=token,
                web_allowed_hosts=web_allow_host,
                web_limits=limits,
                processing_guarantee=processing_guarantee,
                data_dir=data_dir,
                standby_replicas=standby_replicas,
            )
            typer.echo(summary, err=True)
            if code == FAILED:  # (one that refused its input said why itself: exit code 2)
                _fail(f"worker processes failed: {failed}", FAILED)
            raise typer.Exit(code)
        child = child_index()
        if child is not None:  # a process of a group: its log lines say which
            structlog.contextvars.bind_contextvars(process=child)
        while True:
            running = Worker(
                the_app,
                broker=url,
                web_port=web_port,
                web_host=web_host,
                idle_hint=IDLE_HINT,
                fail_fast=fail_fast,
                web_token=token,
                web_allowed_hosts=web_allow_host,
                web_limits=limits,
                processing_guarantee=processing_guarantee,
                data_dir=data_dir,
                standby_replicas=standby_replicas,
                # A process of a group keeps its transactional id across restarts, so the
                # next one aborts what a killed one left open at once.
                transactional_id=None if child is None else f"{the_app.name}-p{child}",
            )
            try:
                serving = _serve(running) if child is None else serve_child(running, _serve)
                with stop_when_stdout_closes(running.stop):
                    error = asyncio.run(serving)
            except (DefinitionError, ConfigurationError):
                raise  # bad input: one line per problem, exit 2 (see _errors)
            except Exception as exc:  # the worker could not start: broker unreachable, ...
                error = exc
            if isinstance(error, DefinitionError):  # the app's code, in an agent: bad input
                _fail(str(error), USAGE)  # and exit 2: a process group does not restart it
            if not isinstance(error, TransactionAborted):
                break
            # Nothing since the last commit counts: a new worker starts from it, with its
            # tables rebuilt from their changelogs, and rejoins the group.
            log.warning("starting the worker again from the last committed transaction")
        if error is not None:
            if fail_fast or (log_level == "debug" and not isinstance(error, FlowkitError)):
                traceback.print_exception(error)
            _fail(f"worker failed: {_describe(error)}", FAILED)
        if child is None:  # the parent prints one summary for all its processes
            typer.echo(running.summary(), err=True)


@cli.command()
def graph(
    app: AppArg,
    fmt: Annotated[
        Literal["text", "mermaid", "dot", "json"],
        typer.Option("--format", "-f", help="Output format."),
    ] = "text",
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Validate instead of printing: one line per problem on stderr, exit 1 if any.",
        ),
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="With --check: warnings (a topic written that nothing reads, or read that "
            "nothing writes) fail the check too.",
        ),
    ] = False,
) -> None:
    """Print APP's dataflow graph (no broker is contacted)."""
    with _errors():
        the_app = load_app(app)
        if check:
            parse_broker_url(the_app.broker)  # the app's own broker URL, as a worker would
        the_graph = the_app.graph()
    if not check:
        typer.echo(render(the_graph, fmt))
        return
    problems = the_graph.check()
    with _errors():
        problems += the_graph.check_codecs()  # a registry's subjects: the one I/O here
    warnings = the_graph.warnings()
    for problem in problems:
        typer.echo(problem, err=True)
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    if problems or (strict and warnings):
        raise typer.Exit(FAILED)
    counts: dict[str, int] = {}
    for node in the_graph.nodes:
        counts[node.kind] = counts.get(node.kind, 0) + 1
    shown = ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in counts.items())
    noted = f" ({len(warnings)} warning{'' if len(warnings) == 1 else 's'})" if warnings else ""
    typer.echo(f"ok: {shown or 'an empty app'}{noted}")


@cli.command()
def topics(
    app: AppArg,
    broker: BrokerOpt = None,
) -> None:
    """Show the topics APP needs beside what exists on the broker (creates nothing)."""
    with _errors():
        the_app = load_app(app)
        url = broker or the_app.broker
        parse_broker_url(url)
        needed = required_topics(the_app)
        transport = open_transport(the_app, url)
        try:
            existing = asyncio.run(_partition_counts(transport, [s.name for s in needed]))
        except FlowkitError as exc:
            _fail(f"cannot read topics from {redact(url)}: {exc}", FAILED)
    width = max(len(s.name) for s in needed)
    typer.echo(f"{'topic':<{width}}  needs  on broker  notes")
    problems = 0
    for spec in needed:
        have = existing.get(spec.name)
        if have is None:
            status = "missing (created when a worker starts)"
        elif have != spec.partitions:
            status = f"MISMATCH: {count(have, 'partition')}; a worker refuses to start"
            problems += 1
        else:
            status = "ok"
        notes = f"compacted; {status}" if spec.compacted else status
        shown = "-" if have is None else str(have)
        typer.echo(f"{spec.name:<{width}}  {spec.partitions:>5}  {shown:>9}  {notes}")
    if problems:
        raise typer.Exit(FAILED)


cli.add_typer(dlq)
cli.command("dev-broker")(dev_broker)
cli.add_typer(tables)
cli.command()(send)
cli.add_typer(offsets)


async def _partition_counts(transport: Transport, names: list[str]) -> dict[str, int]:
    try:
        counts = {}
        for name in names:
            count = await transport.partition_count(name)
            if count is not None:
                counts[name] = count
        return counts
    finally:
        await transport.aclose()


async def _serve(worker: Worker) -> BaseException | None:
    """Run ``worker`` with uvicorn's signals; the fatal error it stopped on, if any.

    The first SIGINT/SIGTERM stops it gracefully (batches finish, offsets are committed);
    the second forces it: queued work is dropped and the shutdown is cancelled.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    forced = False

    def on_signal(signum: int) -> None:
        # Each step acts before it logs: the stop must not hang on a line that cannot be
        # written (the log lines cannot raise, but a handler that raised would stop nothing).
        nonlocal forced
        name = signal.Signals(signum).name
        if not worker.stopping:
            worker.stop()
            log.info("stopping gracefully; send the signal again to force", signal=name)
        elif not forced:
            # Forced: queued batches are dropped (they are not committed, so nothing is
            # lost), but done work is still committed and the clients are closed.
            forced = True
            worker.stop(force=True)
            log.warning("forcing the worker to stop; a third signal cancels", signal=name)
        else:
            task.cancel()
            log.warning("cancelling the worker", signal=name)

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except NotImplementedError:  # Windows: no loop signal handlers
            signal.signal(signum, lambda s, _: loop.call_soon_threadsafe(on_signal, s))
    try:
        await worker.run()
    except asyncio.CancelledError:
        if not forced:
            raise
        task.uncancel()
    except BaseException as exc:
        if exc is not worker.error:
            raise  # raised by start(): the caller reports it
    return worker.error
