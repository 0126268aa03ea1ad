"""Plain placeholders in ``--help``: ``APP``, not typer's ``{APP}`` and ``APP <str>``.

Typer draws a required argument as ``{APP}`` in the usage line and adds its type (``<str>``)
beside it. The commands here name their arguments with a metavar that says what to give,
so both are noise; the same metavar is all that is shown.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument

__all__ = ["plain_arguments"]


class _PlainArgument(TyperArgument):
    def _usage_display_name(self) -> str:
        return self.display_name_raw + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def plain_arguments(command: Any) -> None:
    """Draw the arguments of ``command`` (a click command, as typer vendors click) and of its
    subcommands with their metavar alone."""
    for param in command.params:
        if type(param) is TyperArgument and param.metavar is not None:
            param.__class__ = _PlainArgument  # same state, other drawing
    for sub in getattr(command, "commands", {}).values():
        plain_arguments(sub)
