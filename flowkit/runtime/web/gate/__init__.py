"""The gate of a worker's web endpoint: a small process that accepts its connections,
hands the worker those within its limit, and answers the rest itself.

A crowd that connects again and again must not cost the worker's records their time.
Accepting, reading and answering a refused connection is Python work, and a thread
would do it under the same interpreter lock as the records; so it is done in a process
of its own. ``BoundedListener`` (``web.limits``) binds the socket, then runs this
package's ``__main__.py`` as a script (``python -I -S .../web/gate/__main__.py``: the
standard library only, so it starts in
milliseconds and loads nothing of flowkit or the app), giving it the listening socket
and one end of a control socket. The gate:

- accepts every connection as it comes (up to ``HOLD`` at a time past the limit), so
  that the kernel's queue stays short: a probe is read at once, never behind a crowd;
- answers a probe (``GET /health``, ``GET /ready``) itself, on every fresh connection,
  with the answer the worker last pushed: the worker's loop may be busy with records
  for seconds, and an orchestrator gives a probe one. The worker pushes an answer as
  soon as it changes (an error, a rebalance), looks ten times a second anyway, and
  pushes it again once a second; the gate reads what was pushed before it answers. An
  answer not pushed again for ``answer_life`` seconds (3) is not given: the worker's
  loop may be stuck, and the probe gets ``503`` saying so. A probe the worker's loop
  answers itself (a process group's ``/ready``, which asks its children) is pushed
  marked for the connections past the limit only;
- passes each other connection to the worker while the worker holds fewer than
  ``max_connections`` (the worker says when one closes), leaving its request unread
  for it; one whose request has not said what it is yet is looked at again for a
  quarter of a second, then passed;
- answers a connection past the limit from what it sent already: a probe as above,
  anything else with ``503``. One whose request has not arrived yet gets a quarter of
  a second for it, while ``max_overflow`` are waiting so (200 a second at most); past
  that, it is reset;
- sends at most 2,000 of those ``503`` a second (and answers at most 200 probes a
  second at once): the rest wait for their turn, in arrival order, in the gate, and
  those due within 10 ms go out together (a wakeup for each would cost more than
  its answer);
- ends when the worker's end of the control socket closes, whether the worker stopped
  or died, after answering what has come (probes too, and the connections it could not
  pass to a worker that was gone) and closing the listening socket; it ignores the
  signals that stop a worker (``SIGINT``, ``SIGTERM``, ``SIGHUP``), which a terminal or
  a supervisor may send to the whole process group.

The control socket carries one message per send (``SOCK_SEQPACKET``). From the gate:
``c`` with the file descriptors of the connections accepted in a row (up to ``ACCEPTS``:
one wakeup of the worker's loop for them all), ``!ERRNO STRERROR`` when accepting failed.
From the worker: ``-`` once per connection closed (several may come in one message),
``pPATH ANSWER``, the whole HTTP answer to a probe on any connection, and ``aPATH
ANSWER``, one for the connections past the limit only.

The package: ``loop`` (``Gate``, the loop above), ``sniffing`` (what a connection's first
bytes say it is: a probe answered here or not), ``answers`` (the answers the gate gives
itself), ``pacer`` (``Pacer``, the pace of those answers), ``process`` (the process's
``main``) and ``__main__`` (the script that runs it). Its modules import the standard
library and each other only.
"""

from __future__ import annotations

from pathlib import Path

from .answers import BUSY, STUCK, overflow_answer, probe_answer, reset
from .loop import (
    ACCEPT_RETRY,
    ACCEPTS,
    DRAIN,
    HOLD,
    OVERFLOW_TIMEOUT,
    QUICK_REFUSALS,
    REFUSALS,
    Gate,
)
from .pacer import Pacer
from .process import yield_to_worker
from .sniffing import OVERFLOW_READ

__all__ = [
    "ACCEPTS",
    "ACCEPT_RETRY",
    "BUSY",
    "DRAIN",
    "SCRIPT",
    "HOLD",
    "OVERFLOW_READ",
    "OVERFLOW_TIMEOUT",
    "QUICK_REFUSALS",
    "REFUSALS",
    "STUCK",
    "Gate",
    "Pacer",
    "overflow_answer",
    "probe_answer",
    "reset",
    "yield_to_worker",
]

SCRIPT = Path(__file__).parent / "__main__.py"
"""What the worker runs: ``python -I -S SCRIPT ...``."""
