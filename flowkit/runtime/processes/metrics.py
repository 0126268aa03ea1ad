"""One set of metrics for a group of worker processes (``--processes N``).

Two sources, because a worker's metrics are of two kinds:

- Counters, histograms and gauges a worker updates as it goes (records in, outputs, dead
  letters, commits, latencies, the app's own metrics) are kept by prometheus-client's
  multiprocess mode in files under the group's directory, one per process, and summed
  here. A child killed with ``kill -9`` leaves its file behind, so a counter's total never
  goes down when a child is restarted: Prometheus would read a drop as a counter reset and
  ``rate()`` would count the whole total again. Gauges are declared ``livesum`` (or
  ``liveall`` for the app's own), and the parent drops a dead child's gauges at once.
- Figures a worker computes from its state when scraped (lag, table keys, watermarks,
  recovery, sinks: ``WorkerCollector``) exist only in a live process, so the parent asks
  each running child's private ``/metrics`` for them and merges them: a gauge labelled by
  partition is held by one process (the highest value wins while a rebalance reports it
  twice), every other series is summed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from .group import ProcessGroup, multiprocess

__all__ = ["GroupCollector", "totals"]

_SCRAPE_TIMEOUT = 2.0  # seconds to wait for a child's /metrics


class GroupCollector(Collector):
    """The group's metrics: the multiprocess files, the children's live figures (fetched
    by ``refresh`` before each scrape) and the parent's own."""

    def __init__(self, group: ProcessGroup) -> None:
        self.group = group
        self.files = multiprocess.MultiProcessCollector(None, path=str(group.metrics_dir))
        self.live: list[Metric] = []

    async def refresh(self, session: aiohttp.ClientSession) -> None:
        """Fetch the running children's live figures."""
        urls = [url for child in self.group.children if (url := child.url()) is not None]
        texts = await asyncio.gather(*(_fetch(session, url + "/metrics") for url in urls))
        self.live = merge_live(text for text in texts if text is not None)

    def collect(self) -> Iterator[Metric]:
        kept = list(self.files.collect())
        yield from kept
        known = {family.name for family in kept}
        yield from (family for family in self.live if family.name not in known)
        yield from self._own()

    def _own(self) -> Iterator[Metric]:
        children = self.group.children
        running = GaugeMetricFamily(
            "flowkit_processes_running", "Worker processes running now, of the group's number"
        )
        running.add_metric([], sum(child.pid is not None for child in children))
        yield running
        wanted = GaugeMetricFamily("flowkit_processes", "Worker processes the group keeps")
        wanted.add_metric([], len(children))
        yield wanted
        restarts = CounterMetricFamily(
            "flowkit_process_restarts", "Worker processes started again after they died"
        )
        restarts.add_metric([], sum(child.restarts for child in children))
        yield restarts


def merge_live(texts: Iterable[str]) -> list[Metric]:
    """The families of several ``/metrics`` texts as one: series summed, except gauges
    labelled by partition (one process holds a partition; the highest value wins)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            series = values.setdefault(family.name, {})
            take_max = merged.type == "gauge"
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in series and not (take_max and "partition" in sample.labels):
                    series[key] += sample.value
                else:
                    series[key] = max(series.get(key, sample.value), sample.value)
    out = []
    for name, family in families.items():
        family.samples = [
            Sample(sample_name, dict(labels), value)
            for (sample_name, labels), value in values[name].items()
        ]
        out.append(family)
    return out


def totals(group: ProcessGroup) -> dict[str, float]:
    """Records in, outputs and dead letters of every process the group ran (dead ones
    included), from the multiprocess files: what the group's summary line reports."""
    wanted = {
        "flowkit_records_in_total": "records_in",
        "flowkit_outputs_total": "outputs",
        "flowkit_dead_letters_total": "dead_letters",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in multiprocess.MultiProcessCollector(None, path=str(group.metrics_dir)).collect():
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


async def _fetch(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=_SCRAPE_TIMEOUT)) as r:
            return await r.text() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None  # it is restarting or stopping: its live figures are missing this once
