"""``flowkit worker APP --processes N|auto``: one parent, N worker processes, one group.

The parent (``run_group``) starts N ``flowkit worker APP`` children through
``flowkit.runtime.processes.group.ProcessGroup``, passes Ctrl-C/SIGTERM on to them, serves one
web endpoint for all of them and prints one summary. A child (``serve_child``) is an
ordinary worker that also writes where its private web endpoint listens, names its process
in its log lines, stops when the parent's pipe closes and prints no summary of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from .._text import count
from ..errors import ConfigurationError
from ..runtime import Worker
from ..runtime.lifecycle.secrets import inherited_secrets
from ..runtime.processes.group import DIR_VAR, INDEX_VAR, ProcessGroup
from ..runtime.web.endpoints import SECRET_VAR
from ..runtime.web.settings import TOKEN_VAR, WebLimits, WebToken
from ..transports import parse_broker_url

__all__ = [
    "child_broker",
    "child_index",
    "child_token",
    "parse_processes",
    "run_group",
    "serve_child",
]

log = structlog.get_logger("flowkit.cli")

BROKER_VAR = "FLOWKIT_BROKER"


def parse_processes(value: str, broker: str) -> int:
    """The number ``--processes`` asks for: a whole number of at least 1, or ``auto`` for
    the machine's cores. More than one needs Kafka."""
    text = value.strip().lower()
    if text == "auto":
        wanted = os.cpu_count() or 1
    elif text.isdigit() and int(text) >= 1:
        wanted = int(text)
    else:
        raise ConfigurationError(
            f"--processes {value!r}: give a whole number of at least 1, or auto (one per core)"
        )
    if wanted > 1 and parse_broker_url(broker)[0] == "memory":
        raise ConfigurationError(
            f"--processes {value}: the memory:// broker lives inside one process; run "
            "several worker processes against Kafka (--broker kafka://host:port)"
        )
    return wanted


def run_group(
    app: str,
    broker: str,
    processes: int,
    *,
    log_level: str,
    log_format: str,
    web_host: str,
    web_port: int | None,
    web_token: WebToken | None = None,
    web_allowed_hosts: list[str] | None = None,
    web_limits: WebLimits | None = None,
    processing_guarantee: str | None = None,
    data_dir: str | None = None,
    standby_replicas: int | None = None,
) -> tuple[int, str, str]:
    """Run ``processes`` workers of ``app`` until a signal stops them: the exit code, the
    summary line of the whole group, and which processes did not stop cleanly."""
    argv = [sys.executable, "-m", "flowkit.cli", "worker", app]
    argv += ["--log-level", log_level, "--log-format", log_format]
    if processing_guarantee is not None:
        argv += ["--processing-guarantee", processing_guarantee]
    if data_dir is not None:  # one for the group: a partition that moves finds its state
        argv += ["--data-dir", data_dir]
    if standby_replicas is not None:
        argv += ["--standby-replicas", str(standby_replicas)]
    if web_port is not None:  # each child serves on a private port the parent asks
        argv += ["--web-port", "0", "--web-host", "127.0.0.1"]
    # What may be secret goes to the children over a pipe, not in their environment (which
    # their user's other processes can read) nor in argv (which anyone's can): the broker
    # URL (its settings may hold a password), the web token (the parent sends it with
    # what it asks them too) and the secret they sign their web adverts with.
    env = dict(os.environ)
    given = {BROKER_VAR: broker}
    for name in (BROKER_VAR, TOKEN_VAR, SECRET_VAR):
        env.pop(name, None)
    if web_token is not None:
        given[TOKEN_VAR] = web_token.reveal()
    if web_port is not None:
        # They redirect table reads to each other, and believe no one else's adverts.
        given[SECRET_VAR] = os.environ.get(SECRET_VAR) or secrets.token_hex(32)
    web = (
        _GroupWeb(web_host, web_port, web_token, web_allowed_hosts, web_limits)
        if web_port is not None
        else None
    )
    return asyncio.run(_run(argv, env, given, processes, web))


@dataclass
class _GroupWeb:
    host: str
    port: int
    token: WebToken | None
    allowed_hosts: list[str] | None
    limits: WebLimits | None


async def _run(
    argv: list[str],
    env: dict[str, str],
    secrets: dict[str, str],
    processes: int,
    settings: _GroupWeb | None,
) -> tuple[int, str, str]:
    async with ProcessGroup(argv, processes, env=env, secrets=secrets) as group:
        web = None
        if settings is not None:
            # The web stack (aiohttp) is imported only by a group that serves it.
            from ..runtime.processes.web import GroupWebServer

            web = GroupWebServer(
                group,
                settings.host,
                settings.port,
                token=settings.token,
                allowed_hosts=settings.allowed_hosts,
                limits=settings.limits,
            )
        if web is not None:
            await web.start()
            log.info("serving /metrics, /ready, /health and /tables for all", url=web.url)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, group.stop)
        try:
            code = await group.run()
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            if web is not None:
                await web.aclose()
        return code, summary(group), "; ".join(group.failures())


def summary(group: ProcessGroup) -> str:
    """One line for the group: what every process it ran did (killed ones included)."""
    from ..runtime.processes.metrics import totals  # (aiohttp: only a group's parent needs it)

    figures = totals(group)
    records, seconds = figures["records_in"], group.elapsed
    rate = records / seconds if seconds > 0 else 0.0
    restarts = sum(child.restarts for child in group.children)
    n = len(group.children)
    processes = "1 process" if n == 1 else f"{n} processes"
    return (
        f"processed {count(int(records), 'record')} in {seconds:.1f} s"
        f" ({count(rate, 'record', fmt=',.0f')}/s) in {processes}"
        f"; {count(int(figures['outputs']), 'output')}"
        f", {count(int(figures['dead_letters']), 'dead letter')}"
        f", {count(restarts, 'restart')}"
    )


def child_index() -> int | None:
    """This process's index in its group, when a parent started it (else None)."""
    value = os.environ.get(INDEX_VAR)
    return int(value) if value and value.isdigit() and os.environ.get(DIR_VAR) else None


def child_token() -> WebToken | None:
    """The web token the parent of this process's group passed it, if any."""
    text = inherited_secrets().get(TOKEN_VAR)
    return WebToken(text) if text else None


def child_broker() -> str | None:
    """The broker URL the parent of this process's group passed it."""
    return inherited_secrets().get(BROKER_VAR)


async def serve_child(
    worker: Worker, serve: Callable[[Worker], Awaitable[BaseException | None]]
) -> BaseException | None:
    """``serve(worker)`` as a child of a group: report the web endpoint, stop with the
    parent."""
    tasks = [asyncio.create_task(_report(worker)), asyncio.create_task(_watch_parent(worker))]
    try:
        return await serve(worker)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _report(worker: Worker) -> None:
    web = worker.web
    if web is None:
        return
    # The web server sets its port when it listens, early in the worker's start; it has
    # no event to wait on, and this runs once per process.
    while web.port == 0:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    _write_report(web.url)


def _write_report(url: str) -> None:
    index, directory = os.environ[INDEX_VAR], os.environ[DIR_VAR]
    path = os.path.join(directory, f"process-{index}.json")
    with open(path + ".tmp", "w") as out:
        json.dump({"pid": os.getpid(), "url": url}, out)
    os.replace(path + ".tmp", path)  # the parent never reads half a file


async def _watch_parent(worker: Worker) -> None:
    """The parent holds the other end of stdin: its end closes when it dies."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (OSError, ValueError):  # not a pipe: nothing to watch
        return
    while await reader.read(4096):
        pass
    if not worker.stopping:
        worker.stop()  # (before the line: the parent's stderr may have gone with it)
        log.warning("the parent process is gone; stopping")
