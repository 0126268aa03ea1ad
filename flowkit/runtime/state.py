"""The worker's side of tables: recovery, changelog flushes, partials, window ticks.

``StateKeeper`` is owned by the ``Worker``. On assignment it rebuilds each table partition
from its changelog (reading up to the high watermark a fetch reports) before the worker
processes any record of that partition. At every checkpoint it sends the windowed tables'
partials and markers, then the latest value of every changed key to the changelogs; the
worker awaits those sends before it commits offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import structlog

from ..app import App
from ..clock import Clock
from ..records import Message, TopicPartition
from ..tables import GlobalTable, Table, TableBase
from ..transports import TopicSpec, Transport
from ..windowed import WindowedTable

__all__ = ["StateKeeper", "read_to_end"]

log = structlog.get_logger(__name__)

SendBytes = Callable[..., Awaitable[Any]]


class StateKeeper:
    """Recovers, flushes and ticks the tables of one worker."""

    def __init__(self, app: App, transport: Transport, clock: Clock, send: SendBytes) -> None:
        self.transport = transport
        self.clock = clock
        self._send = send
        tables = list(app.tables.values())
        self.tables: list[Table[Any, Any]] = [t for t in tables if isinstance(t, Table)]
        self.windowed: list[WindowedTable[Any, Any]] = [
            t for t in tables if isinstance(t, WindowedTable)
        ]
        self.globals: list[GlobalTable[Any, Any]] = [
            t for t in tables if isinstance(t, GlobalTable)
        ]
        self.partitioned: list[Table[Any, Any] | WindowedTable[Any, Any]] = [
            *self.tables,
            *self.windowed,
        ]
        self.repartition = {t.repartition_topic: t for t in self.windowed}
        # One flush at a time: a marker sent ahead of the partials drained before it would
        # let an owner close a window without them (sends may suspend, on Kafka).
        self._outbox_lock = asyncio.Lock()
        self._follower: asyncio.Task[None] | None = None
        for table in self.windowed:
            table.now_ms = self._now_ms

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    @staticmethod
    def specs_for(app: App) -> list[TopicSpec]:
        """Changelog and repartition topics the app's tables need."""
        specs: list[TopicSpec] = []
        for t in app.tables.values():
            if isinstance(t, Table | WindowedTable):
                specs.append(TopicSpec(t.changelog_topic, t.partitions, compacted=True))
            if isinstance(t, WindowedTable):
                specs.append(TopicSpec(t.repartition_topic, t.partitions))
        return specs

    # -- global tables --------------------------------------------------------------------

    async def start_globals(self) -> None:
        """Load global tables whole (seeding empty ones from their loader), then follow."""
        if not self.globals:
            return
        for table in self.globals:
            if table.loader is not None and not await self._has_records(table):
                count = 0
                for key, value in table.loader():
                    await self._send(
                        table.topic.name,
                        None if value is None else table.topic.encode(value),
                        key=table.topic.encode_key(key),
                    )
                    count += 1
                log.info("global table seeded", table=table.name, records=count)
        consumer = self.transport.consumer(group_id=None, client_id="flowkit-global-tables")
        await consumer.start()
        tps: dict[TopicPartition, GlobalTable[Any, Any]] = {}
        for table in self.globals:
            count = await self.transport.partition_count(table.topic.name) or 0
            for p in range(count):
                tps[TopicPartition(table.topic.name, p)] = table
        total, seconds = await self._load(consumer, tps)
        log.info(
            "global tables loaded",
            tables=[t.name for t in self.globals],
            records=total,
            seconds=seconds,
        )
        self._follower = asyncio.create_task(self._follow(consumer, tps), name="global-tables")

    async def _load(
        self, consumer: Any, tps: Mapping[TopicPartition, TableBase[Any, Any]]
    ) -> tuple[int, float]:
        """Assign ``tps`` and apply them to their tables up to the high watermark; returns
        the records read and the seconds it took."""
        consumer.assign(tps)
        started = self.clock.monotonic()
        total = await read_to_end(
            consumer, set(tps), lambda tp, ms: tps[tp].apply_changelog(tp.partition, ms)
        )
        return total, round(self.clock.monotonic() - started, 3)

    async def _has_records(self, table: GlobalTable[Any, Any]) -> bool:
        consumer = self.transport.consumer(group_id=None, client_id="flowkit-probe")
        await consumer.start()
        try:
            count = await self.transport.partition_count(table.topic.name) or 0
            tps = {TopicPartition(table.topic.name, p) for p in range(count)}
            consumer.assign(tps)
            got = await _fetch_some(consumer, tps)
            return got
        finally:
            await consumer.aclose()

    async def _follow(
        self, consumer: Any, tps: dict[TopicPartition, GlobalTable[Any, Any]]
    ) -> None:
        try:
            while True:
                batches = await consumer.getmany(0.5, 10_000)
                for tp, messages in batches.items():
                    tps[tp].apply_changelog(tp.partition, messages)
        finally:
            await consumer.aclose()

    async def aclose(self) -> None:
        """Stop following global tables."""
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
            self._follower = None

    # -- partitioned tables ---------------------------------------------------------------

    async def recover(self, partitions: Iterable[int]) -> None:
        """Rebuild the given partitions of every table from its changelog."""
        wanted = sorted(set(partitions))
        if not self.partitioned or not wanted:
            return
        consumer = self.transport.consumer(group_id=None, client_id="flowkit-recovery")
        await consumer.start()
        try:
            tps: dict[TopicPartition, Table[Any, Any] | WindowedTable[Any, Any]] = {}
            for table in self.partitioned:
                fresh = [p for p in wanted if p < table.partitions and p not in table.held()]
                table.assign(fresh)
                for p in fresh:
                    tps[TopicPartition(table.changelog_topic, p)] = table
            if not tps:
                return
            total, seconds = await self._load(consumer, tps)
            log.info(
                "tables recovered",
                tables=sorted({t.name for t in tps.values()}),
                partitions=wanted,
                records=total,
                seconds=seconds,
            )
        finally:
            await consumer.aclose()

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop state of partitions this worker gave up (after the final flush)."""
        ps = list(partitions)
        for table in self.partitioned:
            table.revoke(ps)

    def has_outbox(self) -> bool:
        """True while windowed tables have partials or markers to send."""
        return any(t.has_outbox() for t in self.windowed)

    async def flush_outbox(self) -> None:
        """Send windowed tables' partials and watermark markers to their owners, in the
        order they were made."""
        async with self._outbox_lock:
            for table in self.windowed:
                items = table.drain_outbox()
                sent = 0
                try:
                    for q, key, value in items:
                        await self._send(table.repartition_topic, value, key=key, partition=q)
                        sent += 1
                finally:
                    # Cancelled or failed midway: what was not sent goes back, first in line
                    # (sending a partial twice is harmless: owners keep one per source).
                    if sent < len(items):
                        table.requeue_outbox(items[sent:])

    async def flush_changelogs(self) -> None:
        """Send the latest value of every changed key to the changelogs."""
        for table in self.partitioned:
            topic = table.changelog_topic
            for p, key, value in table.drain_changes():
                await self._send(topic, value, key=key, partition=p)

    async def receive_partials(self, tp: TopicPartition, messages: list[Message]) -> None:
        """Apply partials arriving at their owner; emit the windows that close."""
        table = self.repartition[tp.topic]
        emissions = table.receive(tp.partition, messages)
        if emissions:
            await table.emit(emissions, self._send)

    def tick(self, caught_up: set[int]) -> None:
        """Let quiet, caught-up partitions move their watermarks."""
        now = self.clock.monotonic()
        for table in self.windowed:
            table.tick(now, caught_up)


async def _fetch_some(consumer: Any, tps: set[TopicPartition]) -> bool:
    for _ in range(3):
        got = await consumer.getmany(0.05, 1)
        if got:
            return True
        highs = [consumer.highwater(tp) for tp in tps]
        if all(h is not None for h in highs) and all(
            h <= consumer.position(tp) for h, tp in zip(highs, tps, strict=True)
        ):
            return False
    return False


async def read_to_end(
    consumer: Any,
    tps: set[TopicPartition],
    apply: Callable[[TopicPartition, list[Message]], None],
) -> int:
    """Read ``tps`` from their start to the high watermark seen in fetches."""
    total = 0
    remaining = set(tps)
    empty_polls = 0
    timeout = 0.0  # first look without waiting: an empty changelog is the common case
    while remaining:
        batches = await consumer.getmany(timeout, 50_000)
        timeout = 0.05
        for tp, messages in batches.items():
            apply(tp, messages)
            total += len(messages)
        for tp in list(remaining):
            high = consumer.highwater(tp)
            if high is not None and consumer.position(tp) >= high:
                remaining.discard(tp)
        if batches:
            empty_polls = 0
        else:
            empty_polls += 1
            if empty_polls >= 20:
                # A partition that never reported a high watermark has nothing to read.
                remaining = {tp for tp in remaining if consumer.highwater(tp) is not None}
                if empty_polls >= 200:
                    raise TimeoutError(f"recovery stalled on {sorted(remaining)}")
    return total
