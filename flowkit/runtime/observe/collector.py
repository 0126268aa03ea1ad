"""Metrics read from a worker's state when Prometheus scrapes, not kept up to date.

Lag, table sizes, watermarks, recovery progress and sink queues are gauges of state the
worker holds anyway (the consumer's positions and watermarks, the stores' dicts, the sink
runners' counters). ``WorkerCollector`` reads them at scrape time, so the record path pays
nothing for them, and a partition the worker gave up has no series: it is simply not
reported any more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ...errors import TransportError
from ...state import SessionStore, SlidingStore, Table, WindowedStore, WindowedTable
from ...state.windowed.stage1 import NONE

if TYPE_CHECKING:
    from ..worker import Worker

__all__ = ["WorkerCollector", "partition_lag"]


def partition_lag(worker: Worker) -> list[tuple[str, int, int, float]]:
    """(topic, partition, lag in records, lag in seconds) of every assigned partition.

    Records: the high watermark of the last fetch minus the first record not processed yet
    (records fetched and waiting for their agent count: they are lag too), or minus the
    consumer's position when nothing was fetched. Seconds: 0 when caught up; else the age
    of the oldest record fetched and not processed, or, when every record fetched is done,
    the age of the newest record read (or the time since the worker started, when nothing
    was read yet).
    """
    fetcher = worker.fetcher
    if fetcher is None:
        return []
    consumer = fetcher.consumer
    now_ms = time.time() * 1000
    out = []
    for tp in sorted(consumer.assignment()):
        high = consumer.highwater(tp)
        try:
            position = consumer.position(tp)
        except TransportError:
            continue
        if high is None:
            continue
        first, oldest = worker.tracker.unprocessed(tp)
        records = max(high - (position if first is None else min(first, position)), 0)
        seconds = 0.0
        if records:
            newest = oldest if oldest is not None else fetcher.newest_ts.get(tp)
            seconds = worker.elapsed if newest is None else max(now_ms - newest, 0.0) / 1000
        out.append((tp.topic, tp.partition, records, seconds))
    return out


class WorkerCollector(Collector):
    """Gauges and counters computed from one worker's state at each scrape."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        worker = self.worker
        yield from self._lag()
        yield from self._tables()
        yield from self._sinks()
        recovery = worker.state.recovery
        left = GaugeMetricFamily(
            "flowkit_recovery_records_left",
            "Changelog records left to read before the tables are recovered",
        )
        left.add_metric([], recovery.left)
        yield left
        done = CounterMetricFamily(
            "flowkit_recovery_records", "Changelog records read to recover tables"
        )
        done.add_metric([], recovery.done)
        yield done
        rate = GaugeMetricFamily(
            "flowkit_recovery_records_per_second", "Recovery rate of the recovery under way"
        )
        rate.add_metric([], recovery.rate())
        yield rate
        yield from self._standby()

    def _standby(self) -> Iterator[Metric]:
        standbys = self.worker.state.standbys
        if not standbys:
            return
        followed = GaugeMetricFamily(
            "flowkit_standby_partitions", "Table partitions this worker keeps a standby copy of"
        )
        followed.add_metric([], standbys.partitions())
        yield followed
        lag = standbys.lag()
        if lag is not None:  # (unknown until the first fetch)
            records = GaugeMetricFamily(
                "flowkit_standby_lag_records",
                "Changelog records the standby copies have not read yet",
            )
            records.add_metric([], lag)
            yield records

    def _lag(self) -> Iterator[Metric]:
        records = GaugeMetricFamily(
            "flowkit_consumer_lag_records",
            "High watermark minus the consumer's position, per assigned partition",
            labels=["topic", "partition"],
        )
        seconds = GaugeMetricFamily(
            "flowkit_consumer_lag_seconds",
            "Age of the newest record read from a lagging partition (0 when caught up)",
            labels=["topic", "partition"],
        )
        for topic, partition, lag, age in partition_lag(self.worker):
            records.add_metric([topic, str(partition)], lag)
            seconds.add_metric([topic, str(partition)], age)
        yield records
        yield seconds

    def _tables(self) -> Iterator[Metric]:
        keys = GaugeMetricFamily(
            "flowkit_table_keys",
            "Keys per table partition held by this worker",
            labels=["table", "partition"],
        )
        watermark = GaugeMetricFamily(
            "flowkit_window_watermark_seconds",
            "Watermark of a windowed table's source partition (event time, Unix seconds)",
            labels=["table", "partition"],
        )
        closed = CounterMetricFamily(
            "flowkit_windows_closed", "Windows this worker closed as owner", labels=["table"]
        )
        expired = CounterMetricFamily(
            "flowkit_table_keys_expired", "Keys a table with ttl= deleted", labels=["table"]
        )
        for table, store in self.worker.state.stores.items():
            if isinstance(table, Table):
                for p, size in sorted(store.sizes().items()):
                    keys.add_metric([table.name, str(p)], size)
                if table.ttl_ms is not None:
                    expired.add_metric([table.name], store.expired)
            elif isinstance(table, WindowedTable) and isinstance(
                store, WindowedStore | SessionStore | SlidingStore
            ):
                closed.add_metric([table.name], store.closed_windows)
                parts: dict[int, Any] = store.parts  # a window kind's source partitions
                for p, part in sorted(parts.items()):
                    if part.wm != NONE:
                        watermark.add_metric([table.name, str(p)], part.wm / 1000)
                    keys.add_metric([table.name, str(p)], store.keys_held(p))
        written = CounterMetricFamily(
            "flowkit_changelog_records", "Records written to a table's changelog", labels=["table"]
        )
        for name, count in sorted(self.worker.state.changelog_written.items()):
            written.add_metric([name], count)
        yield keys
        yield watermark
        yield closed
        yield written
        yield expired

    def _sinks(self) -> Iterator[Metric]:
        dispatcher = self.worker.dispatcher
        pending = GaugeMetricFamily(
            "flowkit_sink_pending", "Outputs queued or being written", labels=["sink"]
        )
        families = {
            name: CounterMetricFamily(f"flowkit_sink_{name}", doc, labels=["sink"])
            for name, doc in (
                ("written", "Outputs a sink wrote"),
                ("batches", "Batches handed to a sink (retries included)"),
                ("retries", "Sink writes retried after an error"),
                ("given_up", "Outputs a sink gave up on (dead-lettered)"),
            )
        }
        runners = dispatcher.runners.values() if dispatcher is not None else ()
        for runner in runners:
            pending.add_metric([runner.name], runner.pending())
            for name, family in families.items():
                family.add_metric([runner.name], getattr(runner, name))
        yield pending
        yield from families.values()
