"""What every ``flowkit`` command shares: its exit codes, the APP and ``--broker``
arguments, and how an error becomes one ``Error: ...`` line.

Bad input is one line on stderr and exit code 2 (``USAGE``); a command that ran and failed
(a worker that died, problems found) is one line and 1 (``FAILED``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, NoReturn

import typer

from .._printable import printable
from ..errors import FlowkitError, GraphError

__all__ = [
    "FAILED",
    "USAGE",
    "AppArg",
    "BrokerOpt",
    "describe",
    "echo_error",
    "errors",
    "fail",
    "one_line",
]

USAGE = 2  # bad input: the exit code click uses for usage errors
FAILED = 1  # the worker stopped on a fatal error, or `graph --check` found problems

AppArg = Annotated[
    str,
    typer.Argument(
        metavar="APP",
        help='The app as "module:attribute", e.g. examples.clickstream:app '
        "(the attribute may be a function with no arguments that returns the App).",
        show_default=False,
    ),
]

BrokerOpt = Annotated[
    str | None,
    typer.Option(
        "--broker",
        "-b",
        envvar="FLOWKIT_BROKER",
        metavar="URL",
        help="memory:// or kafka://host:port[,host:port] (default: the app's own).",
        show_default=False,
    ),
]


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Turns flowkit's errors into one ``Error:`` line each and exit code 2, no traceback."""
    try:
        yield
    except GraphError as exc:
        for problem in exc.problems:
            echo_error(problem)
        raise typer.Exit(USAGE) from None
    except FlowkitError as exc:
        fail(str(exc), USAGE)


def fail(message: str, code: int) -> NoReturn:
    """Print ``message`` as one ``Error:`` line and exit with ``code``."""
    echo_error(message)
    raise typer.Exit(code)


def echo_error(message: str) -> None:
    """``Error: message`` on stderr, on one line, any character that is not printable
    escaped (a message may quote a record's bytes)."""
    typer.echo(f"Error: {printable(one_line(message))}", err=True)


def describe(exc: BaseException) -> str:
    """``Type: message``, or the type alone when the message is empty."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())
