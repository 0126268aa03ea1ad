"""Where in the user's code a failure happened: the line a failed record's log names.

An agent's exception passes through flowkit's own frames (the stream loop, the dispatcher)
and often through libraries' (msgspec, asyncio). What a user wants to read is the innermost
frame of their own code: ``orders.py:12 in find_big``. Computed only for a failure that is
logged (the log budget bounds how many), never on the clean path.
"""

from __future__ import annotations

import os
import sysconfig
from types import TracebackType

__all__ = ["user_location"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The standard library and installed packages: not the user's code.
_NOT_USERS = tuple(
    {
        os.path.abspath(path) + os.sep
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(name))
    }
    | {_PACKAGE}
)


_GENERATED = ("<frozen", "<flowkit")


def user_location(error: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of ``error`` (or of the errors it
    was raised from) that is neither flowkit's, the standard library's nor an installed
    package's; None when there is none (a record that did not decode, say). The file is
    relative to the working directory when it is under it.

    >>> def find_big(amount):
    ...     return 100 / amount
    >>> try:
    ...     find_big(0)
    ... except ZeroDivisionError as exc:
    ...     print(user_location(exc).endswith(":2 in find_big"))
    True
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _innermost(current.__traceback__)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _innermost(tb: TracebackType | None) -> str | None:
    found: TracebackType | None = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        # "<frozen ...>": the interpreter's own; "<flowkit ...>": code flowkit generates
        # (the stream loop, a route's filters and transforms).
        if not filename.startswith(_NOT_USERS) and not filename.startswith(_GENERATED):
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    code = found.tb_frame.f_code
    path = code.co_filename
    if os.path.isabs(path):
        relative = os.path.relpath(path)
        path = relative if not relative.startswith("..") else path
    return f"{path}:{found.tb_lineno} in {code.co_name}"
