"""The app's timers and tasks, run by the worker with their ``on_error`` policy.

A timer or task that raises stops the worker with ``TaskFailed`` (one line, exit 1)
unless it was declared with ``on_error="restart"`` (a task runs again after a backoff of
1 s doubling to 60 s; a timer fires again at its next tick) or ``on_error="ignore"`` (a
task is not run again; a timer fires again at its next tick). Every failure is logged.

A crontab timer sleeps on the worker's clock until the next time its schedule names (in
its time zone), calls the function, and computes the next time from the clock again: a
call that takes longer than the period skips the ticks it overlapped, as cron does.
A timer declared ``on_leader=True`` is called only while ``leader()`` says this worker
leads (``leader_of``); on the others its ticks pass without a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import structlog

from ...agents import Timer
from ...clock import Clock
from ...errors import TaskFailed
from ...records import TopicPartition

__all__ = ["leader_of", "run_timer"]

log = structlog.get_logger(__name__)

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0


def leader_of(
    topics: list[str], assignment: Callable[[], Collection[TopicPartition]] | None
) -> Callable[[], bool]:
    """ "Does this worker lead?": it holds partition 0 of the first of ``topics`` (by
    name). Kafka gives each partition to one member of the group, so one worker does; a
    worker that reads no topic is alone, so it leads."""
    if assignment is None or not topics:
        return lambda: True
    first = TopicPartition(sorted(topics)[0], 0)
    return lambda: first in assignment()


async def run_timer(
    timer: Timer,
    clock: Clock,
    *,
    fail_fast: bool = False,
    leader: Callable[[], bool] = lambda: True,
) -> None:
    """Run ``timer`` (every interval, or on its crontab) or a task (once) until it ends
    or is cancelled."""
    if timer.cron is not None:
        cron = timer.cron
        while True:
            now = clock.time()
            await clock.sleep(cron.next_after(now) - now)
            if not timer.on_leader or leader():
                await _call(timer, fail_fast)
    if timer.interval is None:
        backoff = FIRST_BACKOFF
        while not await _call(timer, fail_fast):
            if timer.on_error != "restart":
                return
            log.info("task starting again", name=timer.name, backoff=backoff)
            await clock.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        return
    while True:
        await clock.sleep(timer.interval)
        if not timer.on_leader or leader():
            await _call(timer, fail_fast)


async def _call(timer: Timer, fail_fast: bool) -> bool:
    """Call the timer's function once; False if it raised (and the policy goes on)."""
    try:
        await timer.fn()
        return True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if fail_fast or timer.on_error == "stop":
            raise TaskFailed(f"{timer.kind} {timer.name!r} failed: {exc!r}") from exc
        log.error(f"{timer.kind} failed", name=timer.name, on_error=timer.on_error, error=repr(exc))
        return False
