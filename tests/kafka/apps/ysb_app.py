"""YSB without the event generator, closing idle windows after 2 s of quiet.

The test produces the events itself, with event times about a minute behind the wall
clock: once a partition has caught up and stayed quiet for ``idle_timeout``, its watermark
moves to the wall clock minus grace, which passes every window of the data set.
"""

from __future__ import annotations

from examples import ysb

GRACE = 5.0
IDLE_TIMEOUT = 2.0

app = ysb.make_app(generate=False, grace=GRACE, idle_timeout=IDLE_TIMEOUT, on_close=None)
