"""The worker's side of tables: their stores, recovery, changelog flushes, partials, ticks.

``StateKeeper`` is owned by the ``Worker``. It builds one store per table declaration (the
state of this worker only: see ``flowkit.state.stores``). On assignment it rebuilds each
table partition from its changelog (reading up to the high watermark a fetch reports)
before the worker processes any record of that partition. At every checkpoint it sends
the windowed tables' partials and markers, then the latest value of every changed key to
the changelogs; the worker awaits those sends before it commits offsets.

Plain tables keep local state where the worker has a data directory (the ``rocksdb://``
store always has one): each partition's state carries the changelog offset it reflects
(``flowkit.state.local.Stamp``), so recovery replays only the changelog after it. Local
state that is not this partition's, or that the changelog does not reach (a new broker,
a deleted topic), is dropped with one log line and the partition rebuilt from the start.

With standby replicas (``flowkit.runtime.tables.standby``), a partition of any partitioned
table (plain, windowed, session, sliding, a join's buffers) this worker followed while
another owned it is taken warm: only the changelog after the copy's position replays.
Global tables are loaded whole and followed (``flowkit.runtime.tables.globals``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from ...app import App
from ...clock import Clock
from ...deadletter import dead_letter_headers, dead_letter_topic
from ...records import Message, TopicPartition
from ...redaction import redact_url
from ...state import GlobalTable, StreamJoin, Table, TableStore, WindowedTable
from ...state.joins.rocks import RocksJoinStore
from ...state.joins.store import JoinStore
from ...state.rocks import RocksTableStore
from ...state.snapshots import Captured, SnapshotFiles
from ...state.windowed import SessionTable, SlidingTable
from ...state.windowed.disk_store import DiskWindowedStore
from ...state.windowed.session_disk_store import DiskSessionStore
from ...state.windowed.sliding_disk_store import DiskSlidingStore
from ...transports import OutRecord, TopicSpec, Transport, read_to_end
from .globals import GlobalTables
from .recovery import RecoveryProgress
from .standby import OnDisk, Standbys, Taken
from .windowing import Spawn, WindowedFlow

__all__ = ["StateKeeper"]

log = structlog.get_logger(__name__)

CHANGELOG_BATCH = 10_000
"""The most changelog records sent in one batch: a checkpoint after a window of a million
keys closed sends its changes a batch at a time, not copied into one list per partition."""

SendBytes = Callable[..., Awaitable[Any]]
SendBatch = Callable[[str, int, list[OutRecord]], Awaitable[None]]
Change = tuple[int, bytes, bytes | None]  # (partition, key, value or None)
# (A table whose keys expire adds each key's write time: the record's timestamp.)


DEFAULT_DATA_DIR = "flowkit-data"
"""Where the ``rocksdb://`` store keeps its databases when no data directory is given
(relative to the working directory)."""

STANDBY_DIR = "standby"
"""Under the data directory: the standby copies of ``rocksdb://`` tables' partitions."""


class StateKeeper(WindowedFlow):
    """Holds, recovers, flushes and ticks the tables of one worker."""

    def __init__(
        self,
        app: App,
        transport: Transport,
        clock: Clock,
        send: SendBytes,
        send_batch: SendBatch | None = None,
        *,
        data_dir: Path | None = None,
        sent_end: Callable[[], Mapping[tuple[str, int], int]] = dict,
        standby_replicas: int | None = None,
    ) -> None:
        self.transport = transport
        self.clock = clock
        self._send = send
        self._send_batch = send_batch  # changelogs: a batch per partition
        self._sent_end = sent_end  # per (topic, partition): the end of what was acked
        self.broker = redact_url(transport.url)  # in local state's stamp: no secrets
        self.data_dir = data_dir
        # Memory stores snapshot only where a data directory was given.
        self.snapshots = None if data_dir is None else SnapshotFiles(data_dir, broker=self.broker)
        # Per (table, partition) with local state: the changelog offset it reflects.
        self.offsets: dict[tuple[Any, int], int] = {}
        # Memory stores' snapshots at checkpoints: at most every so many seconds; those
        # taken with the changes a checkpoint sends, written once the changelog has them.
        self.snapshot_interval = app.snapshot_interval
        self._snapshot_due = time.monotonic() + (app.snapshot_interval or 0.0)
        self._captured: list[tuple[Any, int, Captured]] = []
        # Changes were drained that the changelog may not hold: set by a drain, cleared
        # once persist() finds them acknowledged. While set, a memory store's dict is ahead
        # of the offset it would be stamped with (a checkpoint failed after its drain).
        self._ahead = False
        tables = list(app.tables.values())
        # This worker's state of every table: what ``table[key]`` reaches in its tasks.
        self.stores: dict[Any, Any] = {t: self._new_store(app, t) for t in tables}
        self.windowed: list[WindowedTable[Any, Any]] = [
            t for t in tables if isinstance(t, WindowedTable)
        ]
        self.globals: list[GlobalTable[Any, Any]] = [
            t for t in tables if isinstance(t, GlobalTable)
        ]
        self.global_tables = GlobalTables(
            self.globals, self.stores, transport, send, self._load, self._dead_letter_refused
        )
        self.partitioned: list[Table[Any, Any] | WindowedTable[Any, Any] | StreamJoin] = [
            *(t for t in tables if isinstance(t, Table)),
            *self.windowed,
            *(t for t in tables if isinstance(t, StreamJoin)),  # the joins' buffers
        ]
        self.dlq = dead_letter_topic(app.name)  # where failed window results go
        self.start_windowing()
        self.recovery = RecoveryProgress()  # for metrics and the console
        self.changelog_written: dict[str, int] = {}  # records per table, for metrics
        # Warm copies of the partitioned tables' partitions owned by other workers.
        replicas = app.standby_replicas if standby_replicas is None else standby_replicas
        followed = self.partitioned if replicas else []
        self.standbys = Standbys(
            transport,
            {t: self._new_store(app, t, standby=True) for t in followed},
            client_id=f"{app.name}-standby",
        )

    def _new_store(self, app: App, table: Any, *, standby: bool = False) -> Any:
        on_disk = (getattr(table, "store_kind", None) or app.store) == "rocksdb://"
        if not on_disk:
            return table.new_store(self.now_ms)
        data_dir = (self.data_dir or Path(DEFAULT_DATA_DIR)).absolute()
        # A standby copy lives beside the owned partitions, never in their place; one
        # another process here holds is not waited for: that process has the copy.
        where: dict[str, Any] = {"data_dir": data_dir, "broker": self.broker}
        if standby:
            where = {"data_dir": data_dir / STANDBY_DIR, "broker": self.broker, "lock_tries": 1}
        if isinstance(table, StreamJoin):
            return RocksJoinStore(table, self.now_ms, **where)
        if isinstance(table, SessionTable):
            return DiskSessionStore(table, self.now_ms, **where)
        if isinstance(table, SlidingTable):
            return DiskSlidingStore(table, self.now_ms, **where)
        if isinstance(table, WindowedTable):  # tumbling and hopping windows
            return DiskWindowedStore(table, self.now_ms, **where)
        if isinstance(table, Table):
            return RocksTableStore(table, now_ms=self.now_ms, **where)
        return table.new_store(self.now_ms)

    def _local(self, store: Any) -> bool:
        # A store whose partitions carry the changelog offset they reflect (a standby
        # copy needs it too: a partition given up is followed on from there).
        return isinstance(store, OnDisk) or (
            isinstance(store, TableStore)
            and (self.snapshots is not None or store.table in self.standbys.stores)
        )

    def now_ms(self) -> int:
        """The worker's wall clock, in milliseconds."""
        return int(self.clock.time() * 1000)

    @staticmethod
    def specs_for(app: App) -> list[TopicSpec]:
        """Changelog and repartition topics the app's tables need."""
        specs: list[TopicSpec] = []
        for t in app.tables.values():
            if isinstance(t, Table | WindowedTable | StreamJoin):
                specs.append(
                    TopicSpec(t.changelog_topic, t.partitions, compacted=True, internal=True)
                )
            if isinstance(t, WindowedTable):
                specs.append(TopicSpec(t.repartition_topic, t.partitions, internal=True))
        return specs

    # -- global tables --------------------------------------------------------------------

    async def start_globals(self, spawn: Spawn) -> None:
        """Load global tables whole (seeding empty ones from their loader), then follow
        their topics in a task started with ``spawn`` (the worker's supervisor)."""
        await self.global_tables.start(spawn)

    async def _load(
        self,
        consumer: Any,
        tps: Mapping[TopicPartition, Any],
        apply: Callable[[TopicPartition, Sequence[Message]], None] | None = None,
    ) -> int:
        """Apply ``tps`` (assigned) to their tables up to the high watermark; returns the
        records read."""
        if apply is None:
            apply = lambda tp, ms: tps[tp].apply_changelog(tp.partition, ms)  # noqa: E731
        watched = self.recovery.watch(consumer, tps, apply)
        try:
            total = await read_to_end(consumer, set(tps), watched)
        finally:
            self.recovery.finish()
        await self._dead_letter_refused(set(tps.values()))
        return total

    # -- partitioned tables ---------------------------------------------------------------

    def start_standbys(self, spawn: Spawn) -> None:
        """Start following other workers' partitions, where the app keeps standbys."""
        if self.standbys:
            spawn(self.standbys.run(), "standby")

    def _stand_by(self) -> None:
        if self.standbys:
            self.standbys.follow({t: self.stores[t].held() for t in self.standbys.stores})

    async def recover(self, partitions: Iterable[int]) -> None:
        """Rebuild the given partitions of every table: from a standby copy, or local
        state, and the changelog after it, or from the whole changelog."""
        await self._recover(partitions)
        self._stand_by()
        if self.closing():  # a close a crash or a revocation interrupted goes on
            self.close_soon.set()

    async def _recover(self, partitions: Iterable[int]) -> None:
        wanted = sorted(set(partitions))
        if not self.partitioned or not wanted:
            return
        started = time.monotonic()  # real seconds, whatever clock the worker runs on
        tps: dict[TopicPartition, Any] = {}
        starts: dict[TopicPartition, int] = {}
        names: set[str] = set()
        warm: set[TopicPartition] = set()
        for table in self.partitioned:
            store = self.stores[table]
            fresh = [p for p in wanted if p < table.partitions and p not in store.held()]
            placed = self._place_standbys(store, fresh)
            store.assign(fresh)
            for p in fresh:
                tp = TopicPartition(table.changelog_topic, p)
                tps[tp] = store
                names.add(table.name)
                if p in placed:
                    start = self._placed(store, p, placed[p])
                else:
                    start = self._take_standby(store, p)
                if start is not None:
                    starts[tp] = start
                    warm.add(tp)
                    continue
                start = self._open_local(store, p)
                if start is not None:
                    starts[tp] = start
        if not tps:
            return
        total, foreign = await self._replay(tps, starts)
        if foreign:
            for tp in sorted(foreign):
                store = tps[tp]
                log.warning(
                    "local state not used; rebuilding from the changelog",
                    table=store.table.name,
                    partition=tp.partition,
                    reason=f"it reflects offset {starts[tp]}, beyond the changelog's end",
                )
                store.reset(tp.partition)
                self.offsets.pop((store.table, tp.partition), None)
            more, _ = await self._replay({tp: tps[tp] for tp in foreign}, {})
            total += more
        standby = len(warm - foreign)
        self.recovery.from_local += len(starts) - len(foreign) - standby
        self.recovery.from_standby += standby
        log.info(
            "tables recovered",
            tables=sorted(names),
            partitions=wanted,
            records=total,
            from_local_state=len(starts) - len(foreign) - standby,
            from_standby=standby,
            seconds=round(time.monotonic() - started, 3),
        )

    def _take_standby(self, store: Any, partition: int) -> int | None:
        """The changelog offset of the standby copy of ``partition``, now the store's
        state, or None: no copy (or, on disk, none newer than the owner's own state)."""
        if store.table not in self.standbys.stores:
            return None
        on_disk = isinstance(store, OnDisk)
        taken = self.standbys.take(store.table, partition, into=None if on_disk else store)
        if taken is None:
            return None
        offset, refused = taken
        store.rejected.extend(refused)  # dead-lettered after the gap, as a replay would
        if on_disk:
            own = store.local_offset(partition)
            if own is not None and own >= offset:
                return None  # this worker's own local state is as far: it is used
            self._move_copy(store, partition)
            found = store.local_offset(partition)  # the stamp, checked as on any open
            if found is None:
                return None
            offset = found
        self.offsets[(store.table, partition)] = offset
        return offset

    def _move_copy(self, store: Any, partition: int) -> None:
        """Make the closed standby copy of ``partition`` (a database stamped for it) the
        state of ``partition`` in ``store``: moved, not copied; opened as on assignment."""
        source = self.standbys.stores[store.table].path(partition)
        store.revoke([partition])
        target = store.path(partition)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        source.rename(target)
        store.assign([partition])

    def _place_standbys(self, store: Any, partitions: Sequence[int]) -> dict[int, Taken]:
        """Move the ``rocksdb://`` standby copies of those ``partitions`` this worker keeps
        no local state of into their place, before the partitions are opened (side by side):
        each is opened once, as the owner's database."""
        placed: dict[int, Taken] = {}
        if not isinstance(store, OnDisk) or store.table not in self.standbys.stores:
            return placed
        copy = self.standbys.stores[store.table]
        for p in partitions:
            target, source = store.path(p), copy.path(p)
            if target.exists():
                continue  # its own state: compared with the copy's (``_take_standby``)
            taken = self.standbys.take(store.table, p)  # the copy's database closed
            if taken is None:
                continue
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                source.rename(target)
            placed[p] = taken
        return placed

    def _placed(self, store: Any, partition: int, taken: Taken) -> int | None:
        """The changelog offset of a standby copy ``_place_standbys`` moved into place, as
        its stamp says once opened (None: it did not open, and was rebuilt empty)."""
        store.rejected.extend(taken[1])  # dead-lettered after the gap, as a replay would
        offset: int | None = store.local_offset(partition)
        if offset is not None:
            self.offsets[(store.table, partition)] = offset
        return offset

    def _open_local(self, store: Any, partition: int) -> int | None:
        """The changelog offset the local state of ``partition`` reflects (loading a
        memory store's snapshot), or None: no usable local state."""
        if isinstance(store, OnDisk):
            offset = store.local_offset(partition)
        elif self.snapshots is not None and isinstance(store, TableStore):
            offset = self.snapshots.load(store, partition)
        else:
            return None
        if offset is not None:
            self.offsets[(store.table, partition)] = offset
        return offset

    async def _replay(
        self, tps: Mapping[TopicPartition, Any], starts: Mapping[TopicPartition, int]
    ) -> tuple[int, set[TopicPartition]]:
        """Read ``tps`` from ``starts`` (else from their start) to their end; returns the
        records read and the partitions whose start the changelog does not reach."""
        consumer = self.transport.consumer(group_id=None, client_id="flowkit-recovery")
        await consumer.start()
        foreign: set[TopicPartition] = set()

        def apply(tp: TopicPartition, messages: Sequence[Message]) -> None:
            if tp in foreign:
                return
            start = starts.get(tp)
            if start is not None and messages and messages[0].offset < start:
                foreign.add(tp)  # reset to the log's start: the offset is past its end
                return
            tps[tp].apply_changelog(tp.partition, messages)

        try:
            consumer.assign(tps)
            for tp, start in starts.items():
                consumer.seek(tp, start)
            total = await self._load(consumer, tps, apply)
            for tp, store in tps.items():
                if tp in foreign:
                    continue
                high = consumer.highwater(tp)
                begin = starts.get(tp)
                if begin is not None and begin > 0 and (high is None or high < begin):
                    foreign.add(tp)  # a broker that does not reset: nothing was read
                elif self._local(store):
                    key = (store.table, tp.partition)
                    self.offsets[key] = max(self.offsets.get(key, 0), consumer.position(tp))
            return total, foreign
        finally:
            await consumer.aclose()

    def persist(self) -> None:
        """Write local state, stamped with the changelog offset it reflects: called once
        every changelog write drained so far is acknowledged."""
        sent = self._sent_end()
        offsets = self.offsets
        self._ahead = False  # every drained change is acknowledged by now
        for table in self.partitioned:
            store = self.stores[table]
            if not self._local(store):
                continue
            topic = table.changelog_topic
            mine: dict[int, int] = {}
            for p in store.held():
                key = (table, p)
                offset = max(offsets.get(key, 0), sent.get((topic, p), 0))
                offsets[key] = mine[p] = offset
            if isinstance(store, OnDisk):
                store.persist(mine)
        captured, self._captured = self._captured, []
        if self.snapshots is not None:
            for store, p, taken in captured:
                at = offsets.get((store.table, p))
                if at is not None and p in store.held():
                    self.snapshots.write(store, p, taken, offset=at)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop state of partitions this worker gave up (after the final flush): local
        state is closed, memory stores with a data directory write their snapshots."""
        ps = list(partitions)
        for table in self.partitioned:
            store = self.stores[table]
            self._snapshot(store, ps)
            self._keep_standby(store, ps)
            store.revoke(ps)
            for p in ps:
                self.offsets.pop((table, p), None)
        self._stand_by()

    def _keep_standby(self, store: Any, partitions: Iterable[int]) -> None:
        # As for a snapshot: only a partition with nothing changed since its checkpoint
        # is exactly the changelog up to the offset; another one is followed from scratch
        # (as is a windowed table's or a join's in memory: its live objects are not what
        # a replay builds, whatever the offset).
        if store.table not in self.standbys.stores:
            return
        if isinstance(store, OnDisk):  # its database, as written at the checkpoint
            for p in partitions:
                if p in store.held():
                    self.standbys.keep_database(store, p)
            return
        if self._ahead or not isinstance(store, TableStore):
            return  # a failed checkpoint's changes are in the dicts, not in the changelog
        for p in partitions:
            offset = self.offsets.get((store.table, p))
            data = store.partition_data(p)
            if offset is not None and data is not None and not store.dirty(p):
                self.standbys.keep(store.table, p, data, offset)

    def _snapshot(self, store: Any, partitions: Iterable[int]) -> None:
        # Only a partition with nothing changed since its last checkpoint: its dict is
        # then exactly what the changelog holds up to the offset.
        if self.snapshots is None or not isinstance(store, TableStore) or self._ahead:
            return  # (ahead: a failed checkpoint's changes are in the dict, not the changelog)
        for p in partitions:
            offset = self.offsets.get((store.table, p))
            if offset is not None and p in store.held() and not store.dirty(p):
                self.snapshots.save(store, p, offset=offset)

    def aclose(self, *, clean: bool) -> None:
        """Close local state (a clean stop also writes the memory stores' snapshots)."""
        for table in self.partitioned:
            store = self.stores[table]
            if clean:
                self._snapshot(store, store.held())
            if isinstance(store, OnDisk):
                store.aclose()
        self.standbys.aclose()

    async def flush_changelogs(self) -> None:
        """Send the latest value of every changed key to the changelogs."""
        await self.send_changelogs(self.drain_changelogs())

    def drain_changelogs(self) -> list[tuple[str, str, list[Any]]]:
        """What every table changed since the last drain: (table, changelog topic,
        changes), a snapshot of every record processed so far."""
        drained = []
        for table in self.partitioned:
            changes = self.stores[table].drain_changes()
            if changes:
                drained.append((table.name, table.changelog_topic, changes))
                self._ahead = True
        self._capture_snapshots()
        if self.windowed:
            self.drained.set()  # a fetcher waiting in ``relieve`` goes on
        return drained

    def _capture_snapshots(self) -> None:
        # Now, with nothing changed since the drain: the state is what the changelog
        # holds once the drained changes are acknowledged.
        self._captured = []  # any of a checkpoint that failed: never written
        if self.snapshots is None or self.snapshot_interval is None:
            return
        now = time.monotonic()
        if now < self._snapshot_due:
            return
        self._snapshot_due = now + self.snapshot_interval
        for table in self.partitioned:
            store = self.stores[table]
            if isinstance(store, TableStore):
                for p in sorted(store.held()):
                    captured = SnapshotFiles.capture(store, p)
                    if captured is not None:
                        self._captured.append((store, p, captured))

    async def send_changelogs(self, drained: list[tuple[str, str, list[Any]]]) -> None:
        """Send drained changes: batches of at most ``CHANGELOG_BATCH`` per changelog
        partition when the worker's producer sends batches, else one by one. A change
        with a fourth item (a table whose keys expire) is sent with that write time as
        the record's timestamp."""
        written = self.changelog_written
        for name, topic, changes in drained:
            timed = bool(changes) and len(changes[0]) == 4
            if self._send_batch is None:
                for p, key, value, *at in changes:
                    ts = at[0] if at else None
                    await self._send(topic, value, key=key, partition=p, timestamp_ms=ts)
            elif timed:
                by_partition: dict[int, list[OutRecord]] = {}
                for p, key, value, at in changes:
                    batch = by_partition.setdefault(p, [])
                    batch.append((key, value, (), at))
                    if len(batch) == CHANGELOG_BATCH:
                        by_partition[p] = []
                        await self._send_batch(topic, p, batch)
                for p, records in by_partition.items():
                    if records:
                        await self._send_batch(topic, p, records)
            else:
                by_partition = {}
                for p, key, value in changes:
                    found = by_partition.get(p)
                    if found is None:
                        found = by_partition[p] = []
                    found.append((key, value, (), None))
                    if len(found) == CHANGELOG_BATCH:
                        by_partition[p] = []
                        await self._send_batch(topic, p, found)
                for p, records in by_partition.items():
                    if records:
                        await self._send_batch(topic, p, records)
            written[name] = written.get(name, 0) + len(changes)

    async def _dead_letter(self, table: str, rejected: list[tuple[Message, Exception]]) -> None:
        # Records of a table's own topics (changelog, repartition, a global table's topic)
        # that do not decode: anyone with produce rights can write those topics. Each is a
        # dead letter, as any record that does not decode, and the table goes on.
        for message, exc in rejected:
            log.error(
                "record failed",
                action="dead_letter",
                stage="decode",
                table=table,
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                error=repr(exc),
            )
            headers = dead_letter_headers(
                message,
                exc,
                stage="decode",
                agent=f"table:{table}",
                attempts=1,
                failed_at_ms=int(self.clock.time() * 1000),
            )
            await self._send(self.dlq, message.value, key=message.key, headers=headers)

    async def _dead_letter_refused(self, stores: Iterable[Any]) -> None:
        for store in stores:
            # What a store refused of its changelog (or a global table of its topic).
            rejected = getattr(store, "rejected", None)
            if rejected:
                store.rejected = []
                owner = store.join if isinstance(store, JoinStore) else store.table
                await self._dead_letter(owner.name, rejected)
