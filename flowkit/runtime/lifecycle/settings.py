"""How a worker runs: its settings, checked and in seconds, whatever the caller gave."""

from __future__ import annotations

from dataclasses import dataclass

from ...app import App, ProcessingGuarantee, check_guarantee
from ...durations import Seconds, optional_seconds, seconds
from ...errors import ConfigurationError

__all__ = ["WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs (see ``Worker`` for each setting).

    >>> import flowkit
    >>> WorkerSettings.of(flowkit.App("demo"), stall_timeout=None).commit_interval
    1.0
    """

    commit_interval: float
    max_fetch_records: int = 10_000
    fetch_timeout: float = 0.2
    queue_batches: int = 4
    shutdown_timeout: float = 30.0
    stall_timeout: float | None = 300.0
    fail_fast: bool = False
    tick_interval: float = 1.0  # how often quiet partitions' watermarks are checked
    processing_guarantee: ProcessingGuarantee = "at_least_once"

    @classmethod
    def of(
        cls,
        app: App,
        *,
        group_id: str | None = None,
        commit_interval: Seconds | None = None,
        max_fetch_records: int = 10_000,
        fetch_timeout: Seconds = 0.2,
        queue_batches: int = 4,
        shutdown_timeout: Seconds = 30.0,
        stall_timeout: Seconds | None = 300.0,
        fail_fast: bool = False,
        processing_guarantee: ProcessingGuarantee | None = None,
    ) -> WorkerSettings:
        """The settings of a worker of ``app`` given these ``Worker`` arguments (durations
        as seconds or ``timedelta``; None: the app's). ``group_id``, if given, must be
        the app's name."""
        if group_id is not None and group_id != app.name:
            raise ConfigurationError(
                f"group_id {group_id!r} differs from the app's name {app.name!r}: the app "
                "name is the application id, naming the consumer group and the changelog, "
                "repartition and dead-letter topics; to run a separate copy, give the App "
                f"another name (App({group_id!r}, ...))"
            )
        return cls(
            commit_interval=optional_seconds(commit_interval, "commit_interval")
            or app.commit_interval,
            max_fetch_records=max_fetch_records,
            fetch_timeout=seconds(fetch_timeout, "fetch_timeout"),
            queue_batches=queue_batches,
            shutdown_timeout=seconds(shutdown_timeout, "shutdown_timeout"),
            stall_timeout=optional_seconds(stall_timeout, "stall_timeout"),
            fail_fast=fail_fast,
            processing_guarantee=check_guarantee(processing_guarantee or app.processing_guarantee),
        )
