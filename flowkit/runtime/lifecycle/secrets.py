"""What the parent of a ``--processes`` group passed this process: its secrets.

Secrets (the web token, the broker URL, the adverts' signing secret) are not put in a
child's environment, which its user's other processes may read (``/proc/PID/environ``) and
its own children inherit: the child inherits the read end of a pipe holding them, whose
number is in ``FLOWKIT_PROCESS_SECRETS_FD`` (``processes.group`` writes it).
"""

from __future__ import annotations

import json
import os
import stat

__all__ = ["SECRETS_VAR", "inherited_secrets"]

SECRETS_VAR = "FLOWKIT_PROCESS_SECRETS_FD"

_inherited: dict[str, str] | None = None


def inherited_secrets() -> dict[str, str]:
    """The secrets the parent of this process's group passed it (see the module's
    docstring); empty when it has none. The pipe is read at the first call and closed."""
    global _inherited
    if _inherited is None:
        _inherited = {}
        # Taken out of the environment: a process this one starts has no such pipe, and
        # the number may then be one of its other files.
        fd = os.environ.pop(SECRETS_VAR, "")
        if fd.isdigit():
            try:
                if not stat.S_ISFIFO(os.fstat(int(fd)).st_mode):
                    return _inherited
                with os.fdopen(int(fd), "rb") as pipe:
                    data = json.loads(pipe.read())
                if isinstance(data, dict):
                    _inherited = {str(k): str(v) for k, v in data.items()}
            except (OSError, ValueError):
                pass  # not ours (a copy of the variable outside a group): no secrets
    return _inherited
