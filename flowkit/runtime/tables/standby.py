"""Standby replicas: warm copies of the table partitions this worker does not own.

With ``App(standby_replicas=1)`` a worker follows the changelogs of every partition of
its partitioned tables (plain, windowed, session and sliding tables, and joins' buffers)
that the group did not give it, with a consumer of its own (no group, partitions
assigned by hand), and applies them to a store of its own per table, of the table's kind
and store: the same ``apply_changelog`` a recovery runs. When the group gives it one of
those partitions, ``StateKeeper.recover`` takes the warm copy (``take``) and replays only
the changelog after the copy's position: the gap.

A memory-store copy's state moves into the owner's store (``hand_over``: the objects,
not a copy of them). A plain table's partition this worker gives up is kept as a standby
from the state it had (``keep``), so a rebalance that moves every partition away and back
replays nothing again; a windowed table's or a join's is followed from the changelog's
start. A ``rocksdb://`` copy is a database of its own, under ``<data_dir>/standby/``,
stamped with its changelog offset as the owner's is (each batch applied writes both
atomically): a copy outlives a restart of the worker and is followed on from its stamp;
a partition given up is followed from a checkpoint of its database (``keep_database``),
and a takeover moves the copy's directory into the owner's place, unless the owner's own
local state is as far. A copy that another process on this machine holds (workers
sharing a data directory) is not kept: that process has it.

The rule is every partition not owned, not ``n`` copies spread over the group: the
group's membership is not known to a worker, and with a handful of workers each one
holding a copy of everything is what makes any takeover warm. The memory it costs is
the whole table on each worker.

Follows one partition from its position: a batch fetched before a ``seek`` (a
partition dropped and followed again) is not applied, and nothing is applied to a
partition no longer followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from ...errors import ConfigurationError
from ...records import Message, TopicPartition
from ...state import TableStore
from ...state.joins.rocks import RocksJoinStore
from ...state.rocks import RocksTableStore
from ...state.windowed.disk_store import DiskWindowedStore
from ...state.windowed.session_disk_store import DiskSessionStore
from ...state.windowed.sliding_disk_store import DiskSlidingStore
from ...transports import Consumer, Transport

__all__ = ["OnDisk", "Standbys", "Taken"]

log = structlog.get_logger(__name__)

OnDisk = (RocksTableStore, RocksJoinStore, DiskWindowedStore, DiskSessionStore, DiskSlidingStore)
"""The stores whose partitions are databases stamped with their changelog offset."""

Taken = tuple[int, list[tuple[Message, Exception]]]
"""A warm copy handed over: the changelog offset it reflects, and the changelog records
it refused (the new owner dead-letters them, as a replay would)."""

Store = Any
"""A partitioned table's store, of any kind (``assign``, ``revoke``, ``reset``,
``apply_changelog``, ``rejected``; on disk, ``path``, ``local_offset``, ``checkpoint``;
in memory, ``hand_over``)."""

_POLL = 0.2  # seconds a fetch waits when the changelogs are quiet
_MAX_RECORDS = 10_000


class Standbys:
    """The warm copies of one worker, and the task that follows their changelogs."""

    def __init__(
        self,
        transport: Transport,
        stores: Mapping[Any, Store],
        *,
        client_id: str,
    ) -> None:
        self.transport = transport
        self.client_id = client_id
        self.stores: dict[Any, Store] = dict(stores)  # per table declaration: its copy
        self._by_topic = {t.changelog_topic: self.stores[t] for t in self.stores}
        # Per followed changelog partition: the offset of the next record to apply.
        self.positions: dict[TopicPartition, int] = {}
        self._seek: set[TopicPartition] = set()  # followed anew: seek before applying
        self._changed = asyncio.Event()
        self._consumer: Consumer | None = None
        self._behind = False  # followed anew since the copies last caught up

    def __bool__(self) -> bool:
        return bool(self.stores)

    def follow(self, owned: Mapping[Any, set[int]]) -> None:
        """Follow every partition of the tables except ``owned`` ones (per table)."""
        wanted: set[TopicPartition] = set()
        for table in self.stores:
            mine = owned.get(table, set())
            for p in range(table.partitions):
                if p not in mine:
                    wanted.add(TopicPartition(table.changelog_topic, p))
        for tp in set(self.positions) - wanted:
            self._drop(tp)
        for tp in sorted(wanted - set(self.positions)):
            store = self._by_topic[tp.topic]
            try:
                store.assign([tp.partition])
            except ConfigurationError:
                log.info(
                    "standby copy not kept: another process on this machine holds it",
                    table=store.table.name,
                    partition=tp.partition,
                )
                continue
            # A rocksdb:// copy resumes from the offset stamped on it.
            at = store.local_offset(tp.partition) if isinstance(store, OnDisk) else None
            self.positions[tp] = at or 0
            self._seek.add(tp)
            self._behind = True
        self._changed.set()

    def keep(self, table: Any, partition: int, data: dict[Any, Any], at: int) -> None:
        """Follow ``partition`` from ``data``, the state it had at changelog offset ``at``
        (a partition this worker gave up, everything it changed acknowledged)."""
        store = self.stores.get(table)
        if not isinstance(store, TableStore):
            return
        tp = TopicPartition(table.changelog_topic, partition)
        store.adopt(partition, data)
        self.positions[tp] = at
        self._seek.add(tp)
        self._changed.set()

    def keep_database(self, owner: Store, partition: int) -> None:
        """Follow ``partition`` from a checkpoint of ``owner``'s database (a store on
        disk), the state this worker is giving up (still open; hard links, not a copy of
        the data): what a restart would open, stamped with the offset it reflects."""
        copy = self.stores.get(owner.table)
        if not isinstance(copy, OnDisk):
            return
        try:
            copy.assign([partition])  # held by another process here: not copied
        except ConfigurationError:
            return
        copy.revoke([partition])
        owner.checkpoint(partition, copy.path(partition))

    def take(self, table: Any, partition: int, into: Store | None = None) -> Taken | None:
        """Hand the warm copy of ``partition`` over (this worker now owns it), or None:
        none, or one that has read nothing (dropped). A memory store's copy moves into
        ``into``, the owner's store; one on disk is closed, at ``path``, for the owner to
        move."""
        tp = TopicPartition(table.changelog_topic, partition)
        store = self.stores.get(table)
        if store is None or tp not in self.positions:
            return None
        at = self.positions[tp]
        if at == 0 and not isinstance(store, OnDisk):
            self._drop(tp)  # nothing to hand over: the owner replays from the start
            self._changed.set()
            return None
        del self.positions[tp]
        self._seek.discard(tp)
        if into is not None and not isinstance(store, OnDisk):
            store.hand_over(partition, into)
        store.revoke([partition])
        refused = [r for r in store.rejected if r[0].partition == partition]
        if refused:
            store.rejected = [r for r in store.rejected if r[0].partition != partition]
        self._changed.set()
        return at, refused

    def _drop(self, tp: TopicPartition) -> None:
        store = self._by_topic[tp.topic]
        store.revoke([tp.partition])
        store.rejected = [r for r in store.rejected if r[0].partition != tp.partition]
        self.positions.pop(tp, None)
        self._seek.discard(tp)

    def aclose(self) -> None:
        """Close the copies' databases (``rocksdb://`` tables): once ``run`` has ended."""
        for store in self.stores.values():
            if isinstance(store, OnDisk):
                store.aclose()

    def lag(self) -> int | None:
        """Changelog records the copies are behind (None before any fetch told)."""
        consumer = self._consumer
        if not self.positions:
            return 0
        if consumer is None:
            return None
        total = 0
        for tp, at in list(self.positions.items()):
            high = consumer.highwater(tp)
            if high is None:
                return None
            total += max(high - at, 0)
        return total

    def partitions(self) -> int:
        """Table partitions followed now."""
        return len(self.positions)

    async def run(self) -> None:
        """Follow the changelogs until cancelled (the worker's supervisor runs this)."""
        consumer = self.transport.consumer(group_id=None, client_id=self.client_id)
        await consumer.start()
        self._consumer = consumer
        assigned: set[TopicPartition] = set()
        try:
            while True:
                if self._changed.is_set():
                    self._changed.clear()
                    assigned = set(self.positions)
                    consumer.assign(assigned)
                    for tp in self._seek:
                        consumer.seek(tp, self.positions[tp])
                    self._seek.clear()
                if not assigned:
                    await self._changed.wait()
                    continue
                batches = await consumer.getmany(_POLL, _MAX_RECORDS)
                for tp, messages in batches.items():
                    self._apply(tp, messages)
                if self._behind and self.lag() == 0:
                    self._behind = False
                    log.info("standby copies caught up", partitions=len(self.positions))
        finally:
            self._consumer = None
            await consumer.aclose()

    def _apply(self, tp: TopicPartition, messages: Sequence[Message]) -> None:
        if not messages or tp in self._seek:
            return  # fetched before a seek, or dropped since: another position's records
        at = self.positions.get(tp)
        if at is None:
            return
        store = self._by_topic[tp.topic]
        if messages[0].offset < at:
            # Read from the log's start: the copy's position is past the changelog's end
            # (a new broker, a deleted topic). The copy is rebuilt from the start.
            log.warning(
                "standby copy not used; rebuilding from the changelog",
                table=store.table.name,
                partition=tp.partition,
                reason=f"it reflects offset {at}, beyond the changelog's end",
            )
            store.reset(tp.partition)
            self.positions[tp] = 0
            self._seek.add(tp)
            self._changed.set()
            return
        store.apply_changelog(tp.partition, messages)
        self.positions[tp] = messages[-1].offset + 1
