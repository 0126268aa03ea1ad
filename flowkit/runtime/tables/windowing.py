"""The worker's side of windowed tables: their partials and markers to the owners, the
partials arriving at an owner and the windows they close, the close in steps, and the
ticks that move quiet partitions' watermarks.

``WindowedFlow`` is a part of ``StateKeeper`` (``keeper.py``), which holds the stores. The
outbox of every windowed table is sent by one sender at a time, in the order it was made
(a marker must never overtake the partials before it); partials that arrive at their owner
are applied inline by the fetcher, and the windows they close are emitted there (marked as
replayed when an earlier run closed them with the same records). A table whose owners
close windows in steps (on disk) takes one step per checkpoint (``close_windows``), and
``close_soon`` asks for the next checkpoint at once while steps remain, or while owners
hold a chunk of arriving partials (``relieve`` holds the fetcher back meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ...clock import Clock
from ...records import Message, TopicPartition
from ...state import WindowedStore, WindowedTable
from ...transports import Ack

__all__ = ["Spawn", "WindowedFlow"]

Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]

_RELIEF_WAIT = 1.0  # seconds the fetcher waits at most for a checkpoint's drain


class WindowedFlow:
    """The windowed tables' flows of one worker (a part of ``StateKeeper``)."""

    windowed: list[WindowedTable[Any, Any]]
    stores: dict[Any, Any]
    clock: Clock
    dlq: str
    _send: Callable[..., Any]

    def start_windowing(self) -> None:
        """Set up the flows of ``windowed`` (their stores made)."""
        self.repartition = {t.repartition_topic: t for t in self.windowed}
        # Tables whose owners close windows in steps (on disk), a step per checkpoint;
        # set while a step is due, so that the checkpoint comes now, not at its interval.
        self.stepwise = [t for t in self.windowed if self.stores[t].owners.stepwise]
        self.close_soon = asyncio.Event()
        self.drained = asyncio.Event()  # set by each drain of the changelogs (``relieve``)
        # One flush at a time: a marker sent ahead of the partials drained before it would
        # let an owner close a window without them (sends may suspend, on Kafka).
        self._outbox_lock = asyncio.Lock()
        self._outbox_task: asyncio.Task[None] | None = None
        # Held from the windows a batch of partials closes until their results are sent
        # (the acknowledgement between suspends, on Kafka): a checkpoint drains the
        # changelogs under it, so a close never reaches the changelog ahead of its results.
        self.emitting = asyncio.Lock()

    async def _dead_letter(self, table: str, rejected: list[tuple[Message, Exception]]) -> None:
        raise NotImplementedError  # StateKeeper's

    def _windowed_stores(self) -> list[WindowedStore]:
        return [self.stores[t] for t in self.windowed]

    def has_outbox(self) -> bool:
        """True while windowed tables have partials or markers to send, or windows to
        close in steps."""
        return any(store.has_outbox() for store in self._windowed_stores()) or self.closing()

    def closing(self) -> bool:
        """True while a table that closes windows in steps has a step to take: a window
        to close or expire, or keys of windows shipped whole to delete."""
        stores = self.stores
        return any(stores[t].owners.closing() or stores[t].deleting() for t in self.stepwise)

    def holding(self) -> bool:
        """True while the owners of a table that closes windows in steps hold a chunk of
        changes for the next checkpoint (``DiskOwners.holding``)."""
        return any(self.stores[t].owners.holding() for t in self.stepwise)

    async def relieve(self) -> None:
        """Wait, at most about a second, while owners hold a chunk of changes: the next
        checkpoint writes them. The fetcher calls this between two fetches, holding
        nothing a checkpoint takes, so that the partials of a window shipped whole
        arrive a chunk per checkpoint and never all into memory at once."""
        deadline = time.monotonic() + _RELIEF_WAIT
        while self.holding():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.drained.clear()
            self.close_soon.set()
            try:
                await asyncio.wait_for(self.drained.wait(), left)
            except TimeoutError:
                return

    async def close_windows(self) -> None:
        """One step of each owned partition's close, for the tables that close windows
        in steps (on disk), run by a checkpoint before it drains the changelogs: the
        step's cursor is written to the changelog and acknowledged, its results sent,
        then its changes (final values, partials deleted) join the checkpoint's. While
        more steps remain, the next checkpoint is asked for at once (``close_soon``)."""
        for table in self.stepwise:
            store = self.stores[table]
            owners = store.owners
            for q in sorted(owners.owners):
                step = owners.step(q)
                if step is None:
                    continue
                cursor = owners.cursor_record(step)
                if cursor is not None:
                    key, value = cursor
                    ack = await self._send(table.changelog_topic, value, key=key, partition=q)
                    if not isinstance(ack, Ack):
                        await ack
                if step.again:
                    await table.emit(store, step.again, self._send, self.dlq, replayed=True)
                if step.fresh:
                    await table.emit(store, step.fresh, self._send, self.dlq)
                owners.stepped(step)
        if self.closing():
            self.close_soon.set()

    def flush_outbox_soon(self, spawn: Spawn) -> None:
        """Start a flush of the outbox in a task of its own, unless one is under way."""
        task = self._outbox_task
        if task is None or task.done():
            self._outbox_task = spawn(self.flush_outbox(), "outbox")

    async def wait_outbox(self) -> None:
        """Wait for the flush ``flush_outbox_soon`` started (it is never cancelled: it
        sends what it drained)."""
        if self._outbox_task is not None:
            await asyncio.gather(self._outbox_task, return_exceptions=True)

    def shipping(self) -> bool:
        """True while a table on disk has partials of closing windows still to send."""
        return any(self.stores[t].shipping() for t in self.stepwise)

    async def flush_outbox(self, *, ship: bool = False) -> None:
        """Send windowed tables' partials and watermark markers to their owners, in the
        order they were made. A store on disk sends a closing window's partials a chunk
        at a time, only in the fetcher's flushes (``ship``), one chunk a fetch
        (``shipping`` while more remain): the fetcher takes the partials that reach
        owners here between two chunks, so that a window's partials never pile up in
        flight faster than the owners take them."""
        async with self._outbox_lock:
            for table in self.windowed:
                store = self.stores[table]
                topic = table.repartition_topic  # one string, not one a partial
                chunked = store.owners.stepwise
                # (a closing window's partials: a chunk when shipping, else none)
                items = store.drain_outbox(None if ship else 0) if chunked else store.drain_outbox()
                while items:
                    sent = 0
                    try:
                        for q, key, value in items:
                            await self._send(topic, value, key=key, partition=q)
                            sent += 1
                    finally:
                        # Cancelled or failed midway: what was not sent goes back, first in
                        # line (sending a partial twice is harmless: owners keep one per
                        # source).
                        if sent < len(items):
                            store.requeue_outbox(items[sent:])
                    if chunked:
                        break
                    items = store.drain_outbox()
                    if items:
                        await asyncio.sleep(0)
                if store.late_out:
                    await table.deliver_late(store, self._send)
                if chunked:
                    # Sent (not only drained): a window whose last chunk went may leave
                    # the changelog, a drain at a time; never ahead of its partials.
                    store.sent()
                    if store.deleting():
                        self.close_soon.set()

    async def receive_partials(self, tp: TopicPartition, messages: Sequence[Message]) -> None:
        """Apply partials arriving at their owner; emit the windows that close (marked as
        replayed when an earlier run closed them with the same records)."""
        table = self.repartition[tp.topic]
        store = self.stores[table]
        again = store.owners.replayed(tp.partition, messages)
        if again:
            await self._receive(table, store, tp.partition, messages[:again], replayed=True)
        if again < len(messages):
            fresh = messages[again:] if again else messages
            await self._receive(table, store, tp.partition, fresh, replayed=False)

    async def _receive(
        self,
        table: WindowedTable[Any, Any],
        store: WindowedStore,
        q: int,
        messages: Sequence[Message],
        *,
        replayed: bool,
    ) -> None:
        async with self.emitting:
            await self._receive_held(table, store, q, messages, replayed=replayed)

    async def _receive_held(
        self,
        table: WindowedTable[Any, Any],
        store: WindowedStore,
        q: int,
        messages: Sequence[Message],
        *,
        replayed: bool,
    ) -> None:
        emissions = store.receive(q, messages)
        owners = store.owners
        if owners.stepwise and (owners.closing() or owners.holding()):
            # The close goes in steps, at checkpoints; partials arriving in a chunk's
            # number go to the changelog and the disk at once, not held in memory.
            self.close_soon.set()
        await self._dead_letter(table.name, store.owners.take_rejected())
        if store.owners.updates:
            updates = store.owners.take_updates()
            if updates:
                await table.emit(
                    store, updates, self._send, self.dlq, final=False, replayed=replayed
                )
        if not emissions:
            return
        if not replayed and store.owners.marks_replays:
            # Once per batch that closes windows: the changelog learns it first, so a
            # restart that closes them again marks the results (see Owners.emitting).
            key, value = store.owners.emitting(q, messages[-1].offset)
            ack = await self._send(table.changelog_topic, value, key=key, partition=q)
            if not isinstance(ack, Ack):
                await ack
        await table.emit(store, emissions, self._send, self.dlq, replayed=replayed)

    def tick(self, caught_up: set[int]) -> None:
        """Let quiet, caught-up partitions move their watermarks."""
        now = self.clock.monotonic()
        for table in self.windowed:
            self.stores[table].tick(now, caught_up, table.idle_timeout)
