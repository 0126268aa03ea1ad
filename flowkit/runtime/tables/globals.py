"""Global tables: every worker holds each one whole, loaded at its start and followed.

At a worker's start ``GlobalTables`` seeds a global table whose topic is empty from its
``loader``, reads every partition of every global table's topic to its end (counted as a
recovery), then follows the topics in a task of its own for as long as the worker runs.
Records that do not decode are dead letters, as in any table (``StateKeeper``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any

import structlog

from ...records import TopicPartition
from ...state import GlobalTable
from ...transports import Transport

__all__ = ["GlobalTables"]

log = structlog.get_logger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]
Load = Callable[[Any, Mapping[TopicPartition, Any]], Awaitable[int]]


class GlobalTables:
    """This worker's global tables: ``stores`` holds their state, ``send`` seeds them,
    ``load`` reads assigned partitions to their end into their stores, and ``refused``
    dead-letters what their stores refused."""

    def __init__(
        self,
        tables: list[GlobalTable[Any, Any]],
        stores: Mapping[Any, Any],
        transport: Transport,
        send: Callable[..., Awaitable[Any]],
        load: Load,
        refused: Callable[[Iterable[Any]], Awaitable[None]],
    ) -> None:
        self.tables = tables
        self.stores = stores
        self.transport = transport
        self._send = send
        self._load = load
        self._refused = refused

    async def start(self, spawn: Spawn) -> None:
        """Load global tables whole (seeding empty ones from their loader), then follow
        their topics in a task started with ``spawn`` (the worker's supervisor)."""
        if not self.tables:
            return
        for table in self.tables:
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
        tps: dict[TopicPartition, Any] = {}
        for table in self.tables:
            count = await self.transport.partition_count(table.topic.name) or 0
            for p in range(count):
                tps[TopicPartition(table.topic.name, p)] = self.stores[table]
        started = time.monotonic()
        try:
            consumer.assign(tps)
            total = await self._load(consumer, tps)
        except BaseException:
            await consumer.aclose()
            raise
        log.info(
            "global tables loaded",
            tables=[t.name for t in self.tables],
            records=total,
            seconds=round(time.monotonic() - started, 3),
        )
        spawn(self._follow(consumer, tps), "global-tables")

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

    async def _follow(self, consumer: Any, tps: dict[TopicPartition, Any]) -> None:
        try:
            while True:
                batches = await consumer.getmany(0.5, 10_000)
                for tp, messages in batches.items():
                    tps[tp].apply_changelog(tp.partition, messages)
                await self._refused(set(tps.values()))
        finally:
            await consumer.aclose()


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
