"""YSB without the event generator, closing idle windows after 4 s of quiet.

The test produces the events itself, with event times about a minute behind the wall
clock: once a partition has caught up and stayed quiet for ``idle_timeout``, its watermark
moves to the wall clock minus grace, which passes every window of the data set.
"""

from __future__ import annotations

from examples import ysb

GRACE = 5.0
# Longer than a test's producer may stall on a loaded machine: a partition quiet that long
# mid-produce would close its windows early, and its later records would be late.
IDLE_TIMEOUT = 4.0

app = ysb.make_app(generate=False, grace=GRACE, idle_timeout=IDLE_TIMEOUT, on_close=None)
