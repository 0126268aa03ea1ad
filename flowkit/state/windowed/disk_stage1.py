"""Stage 1 of a tumbling or hopping table on disk (``rocksdb://``): the partials of the
windows open on a source partition live in its database, and memory holds only what
changed since the last checkpoint.

The per-record ``add`` is the memory store's, into ``part.partials``; here those dicts hold
*changes*: each key's ``amount``s since the last drain, folded with the table's
``combine``. A drain folds each change into the value on disk (``combine(on disk,
change)``: the combine is associative, as two-phase aggregation needs), puts the result
into the partition's database and its changelog, and empties the dict. A read folds the
same way; so the memory a window takes is that of its keys changed in one checkpoint
interval, not that of all its keys.

A window that closes does not ship in one list either. Its change dict joins a queue
(``_Closing``), and each ``drain_outbox`` ships at most ``chunk`` of the queue's partials:
first those on disk, in key order (a key also in the change dict is folded with it), then
the keys that are only in the change dict. The worker sends a chunk and lets the agents
run before it asks for the next one. A source partition announces its watermark to the
owners only once every window that watermark closed is shipped, so no owner closes a
window before it has all of its partials. Once a window is shipped whole, its keys leave
the changelog and the disk in steps too (``_Deleting``): each drain writes at most
``chunk`` of their tombstones, and the worker asks for the next checkpoint at once while
some remain (``deleting``). A crash in the middle leaves the window's other keys on disk
and in the changelog: the window is recovered with them, its watermark closes it again,
and they are shipped again (harmless, as below) and deleted.

A drain in the middle of a window's shipping writes that window's remaining changes to
disk and changelog as for an open window: a crash then recovers the window whole, and its
watermark closes it again at once (``recovered``); partials shipped twice are harmless, as
an owner keeps one per source and ignores those of windows it closed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from . import disk, wire
from .disk import PARTIAL, DiskPart
from .stage1 import Part, Stage1
from .stages import INF, Change

__all__ = ["DiskStage1"]

_MISSING: Any = object()
_decode = wire.decode
_encode = wire.encode


class _Closing:
    """A closed window of one source partition, being shipped: its changes not yet on disk
    (``changes``), the values a drain wrote that the shipping from disk had passed
    already (``whole``: shipped from memory as they are, never folded again), and where
    on disk the shipping goes on (``resume``, a disk key;
    ``on_disk``: False once every key on disk is shipped)."""

    __slots__ = ("changes", "number", "on_disk", "resume", "start", "whole")

    def __init__(self, number: int, start: int, changes: dict[Any, Any]) -> None:
        self.number = number
        self.start = start
        self.changes = changes
        self.whole: dict[Any, Any] = {}
        self.resume = PARTIAL + disk.start(start)
        self.on_disk = True


class _Deleting:
    """A window of one source partition shipped whole, its keys leaving the changelog and
    the disk a drain's ``chunk`` at a time; ``resume``: the disk key the next step reads
    from."""

    __slots__ = ("group", "number", "resume", "start")

    def __init__(self, number: int, start: int) -> None:
        self.number = number
        self.start = start
        self.group = self.resume = PARTIAL + disk.start(start)


class DiskStage1(Stage1):
    """Stage 1 with its partials in each source partition's database: ``part.partials``
    holds each open window's changes since the last drain (see the module's docstring)."""

    chunk = 10_000
    """How many partials one ``drain_outbox`` ships of the windows closing, and how many
    keys of windows shipped whole one drain deletes: the most a window's close holds in
    memory at once."""

    _disks: dict[int, DiskPart]
    _combine: Callable[[Any, Any], Any]

    def start_disk_stage1(
        self, disks: dict[int, DiskPart], combine: Callable[[Any, Any], Any]
    ) -> None:
        """Use the partitions' databases in ``disks`` (opened on ``assign``) and the table's
        ``combine``."""
        self._disks = disks
        self._combine = combine
        self._closing: deque[_Closing] = deque()
        self._deleting: deque[_Deleting] = deque()  # shipped whole, keys to delete
        self._whole: list[_Deleting] = []  # shipped whole, the last chunk not sent yet

    # -- reads ----------------------------------------------------------------------------

    def partial(self, part: Part, start: int, key: Any) -> tuple[bool, Any]:
        """(True, ``key``'s partial in ``part``'s open window at ``start``) or (False,
        None): the value on disk folded with the change since the last drain."""
        change = part.partials[start].get(key, _MISSING)
        raw = self._disks[part.number].get(PARTIAL + disk.start(start) + _encode(key))
        if raw is None:
            return (False, None) if change is _MISSING else (True, change)
        value = _decode(raw)
        return True, value if change is _MISSING else self._combine(value, change)

    def local(self, key: Any) -> dict[int, dict[int, Any]]:
        """``key``'s partials in the source partitions held here: start -> source -> value."""
        local: dict[int, dict[int, Any]] = {}
        for p, part in self.parts.items():
            for start in part.partials:
                found, value = self.partial(part, start, key)
                if found:
                    local.setdefault(start, {})[p] = value
        return local

    def stage1_keys(self) -> set[Any]:
        """Every key with a partial in an open window of a source partition held here."""
        keys: set[Any] = set()
        for p, part in self.parts.items():
            for start, window in part.partials.items():
                for raw_key, _ in self._disks[p].scan(PARTIAL + disk.start(start)):
                    keys.add(wire.key_from_json(_decode(raw_key[9:])))
                keys.update(window)
        return keys

    # -- closing --------------------------------------------------------------------------

    def close_partials(self, part: Part) -> None:
        """Queue every window that ended at or before the watermark for shipping."""
        wm = part.wm
        size = self.size
        next_end = INF
        part.forget_hot()
        for start in sorted(part.partials):
            if start + size > wm:
                next_end = min(next_end, start + size)
                continue
            changes = part.partials.pop(start)
            if changes or not any(
                w.number == part.number and w.start == start for w in self._closing
            ):  # (a recovery's changelog tail may name a window queued already)
                self._closing.append(_Closing(part.number, start, changes))
            part.dirty.discard(start)
        part.next_end = next_end

    def shipping(self) -> bool:
        """True while partials of closing windows wait to be shipped (a chunk a drain)."""
        return bool(self._closing)

    def has_outbox(self) -> bool:
        """True when partials of closing windows, records or markers wait to be sent."""
        return bool(self._closing) or super().has_outbox()

    def drain_outbox(self, budget: int | None = None) -> list[tuple[int, bytes | None, bytes]]:
        """What to send next: the running updates, up to ``budget`` (by default
        ``chunk``) partials of the windows closing, then a marker from each partition
        whose watermark moved on and whose closed windows are all shipped."""
        if self.updates:
            self.ship_updates()
        if budget is None:
            budget = self.chunk
        closing = self._closing
        while closing and budget > 0:
            window = closing[0]
            budget -= self._ship(window, budget)
            if window.on_disk or window.changes or window.whole:
                break  # the budget ran out
            closing.popleft()
            if not any(
                w.number == window.number and w.start == window.start
                for w in (*self._whole, *self._deleting)
            ):
                self._whole.append(_Deleting(window.number, window.start))
        waiting = {window.number for window in closing}
        for p, part in self.parts.items():
            if p not in waiting and self.announce(part):
                self.mark(p, part)
        out, self._outbox = self._outbox, []
        return out

    def _ship(self, window: _Closing, budget: int) -> int:
        # Up to ``budget`` partials of a closing window into the outbox; how many.
        p, start, changes = window.number, window.start, window.changes
        combine, partition_of, encode_key = self._combine, self._partition_of, self._encode_key
        outbox = self._outbox
        n = 0
        if window.on_disk:
            prefix = PARTIAL + disk.start(start)
            for raw_key, raw in self._disks[p].scan(prefix, window.resume):
                if n == budget:
                    window.resume = raw_key
                    return n
                key = wire.key_from_json(_decode(raw_key[9:]))
                value = _decode(raw)
                change = changes.pop(key, _MISSING)
                if change is not _MISSING:
                    value = combine(value, change)
                outbox.append(
                    (partition_of(key), encode_key(key), wire.partial(start, p, key, value))
                )
                n += 1
            window.on_disk = False
        whole = window.whole
        while whole and n < budget:
            key, value = whole.popitem()
            outbox.append((partition_of(key), encode_key(key), wire.partial(start, p, key, value)))
            n += 1
        while changes and n < budget:
            key, value = changes.popitem()
            outbox.append((partition_of(key), encode_key(key), wire.partial(start, p, key, value)))
            n += 1
        return n

    def ship_updates(self) -> None:
        # Running updates: as Stage1's, each value the disk's folded with the change.
        for p, part in self.parts.items():
            changed = part.changed
            if not changed:
                continue
            for start, key in sorted(changed, key=_window_first):
                if start not in part.partials:
                    continue  # closed: its partials ship with the close
                found, value = self.partial(part, start, key)
                if found:
                    q = self._partition_of(key)
                    self._outbox.append(
                        (q, self._encode_key(key), wire.partial(start, p, key, value))
                    )
            changed.clear()

    # -- the changelog --------------------------------------------------------------------

    def sent(self) -> None:
        """Everything drained from the outbox so far is sent: the windows it shipped
        whole may leave the changelog (their tombstones go after those sends, which a
        checkpoint acknowledges before it sends the changelogs)."""
        self._deleting.extend(self._whole)
        self._whole = []

    def deleting(self) -> bool:
        """True while keys of windows shipped whole are still to delete (a drain deletes
        ``chunk`` of them)."""
        return bool(self._deleting)

    def drain_changes_into(self, out: list[Change]) -> None:
        """Append stage 1's changelog records since the last drain to ``out``, and put
        the same changes on disk: each changed key's new value, up to ``chunk``
        tombstones of the windows shipped whole, and the watermark."""
        disks = self._disks
        if self._deleting:
            self._delete(self.chunk, out)
        for window in self._closing:
            if window.changes:
                part_disk = disks[window.number]
                written = self._write(window.number, part_disk, window.start, window.changes, out)
                # What the disk's shipping already passed ships from memory, whole; the
                # rest, on disk now, ships from there.
                window.whole.update(
                    (key, value)
                    for key, (dk, value) in written.items()
                    if not window.on_disk or dk < window.resume
                )
                window.changes = {}
        for p, part in self.parts.items():
            part_disk = disks[p]
            partials = part.partials
            for start in part.dirty:
                changes = partials.get(start)
                if changes:
                    self._write(p, part_disk, start, changes, out)
                    partials[start] = {}
            part.dirty.clear()
            part.forget_hot()
            self.log_watermark(part, out)

    def _delete(self, budget: int, out: list[Change]) -> None:
        # Up to ``budget`` keys of the windows shipped whole: their tombstones into
        # ``out`` and onto disk; a window whose keys are all gone is dropped whole.
        deleting = self._deleting
        while deleting and budget > 0:
            window = deleting[0]
            p = window.number
            part_disk = self._disks.get(p)
            if part_disk is None:  # revoked meanwhile
                deleting.popleft()
                continue
            head = b'["p",%d,' % window.start
            last = b""
            for raw_key, _ in part_disk.scan(window.group, window.resume):
                if budget == 0:
                    break
                out.append((p, head + raw_key[9:] + b"]", None))
                part_disk.put(raw_key, None)
                last = raw_key
                budget -= 1
            else:
                part_disk.drop(window.group)
                deleting.popleft()
                continue
            window.resume = last + b"\x00"  # the next key after ``last``

    def _write(
        self, p: int, part_disk: DiskPart, start: int, changes: dict[Any, Any], out: list[Change]
    ) -> dict[Any, tuple[bytes, Any]]:
        # Each change folded into the disk's value, put on disk and into ``out``; what
        # was written, key -> (disk key, value).
        combine = self._combine
        at = disk.start(start)
        head = b'["p",%d,' % start
        written: dict[Any, tuple[bytes, Any]] = {}
        new = 0
        for key, change in changes.items():
            kj = _encode(key)
            dk = PARTIAL + at + kj
            raw = part_disk.get(dk)
            if raw is None:
                value = change
                new += 1
            else:
                value = combine(_decode(raw), change)
            encoded = _encode(value)
            part_disk.put(dk, encoded)
            out.append((p, head + kj + b"]", encoded))
            written[key] = (dk, value)
        part_disk.added_partials(start, new)
        return written

    def apply_record(self, part: Part, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1, on disk."""
        if kind == "w":
            self.apply_watermark(part, value)
            self._disks[part.number].put(disk.WATERMARK, None if value is None else _encode(value))
            return
        start = parts[1]
        dk = PARTIAL + disk.start(start) + _encode(parts[2])  # refuses a start beyond 64 bits
        self._disks[part.number].put(dk, None if value is None else _encode(value))
        if value is not None:
            part.partials.setdefault(start, {})

    def load(self, part: Part) -> None:
        """Take ``part``'s stream time and open windows from its database."""
        part_disk = self._disks[part.number]
        raw = part_disk.get(disk.WATERMARK)
        if raw is not None:
            self.apply_watermark(part, _decode(raw))
        for start in part_disk.starts(PARTIAL):
            part.partials.setdefault(start, {})
        self.recovered(part)

    def recovered(self, part: Part) -> None:
        """Tidy ``part`` after its changelog was applied (as ``Stage1.recovered``); the
        windows its watermark already passed (a crash while they were being shipped)
        are shipped again."""
        self.trust_watermark(part)
        part_disk = self._disks[part.number]
        for start in list(part.partials):
            if (
                not part.partials[start]
                and next(part_disk.scan(PARTIAL + disk.start(start)), None) is None
            ):
                del part.partials[start]
        part.next_end = min((s + self.size for s in part.partials), default=INF)
        part.forget_hot()
        if part.next_end <= part.wm:
            self.close_partials(part)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state, and their windows still to ship."""
        ps = set(partitions)
        self._closing = deque(w for w in self._closing if w.number not in ps)
        self._deleting = deque(w for w in self._deleting if w.number not in ps)
        self._whole = [w for w in self._whole if w.number not in ps]
        super().revoke(ps)


def _window_first(change: tuple[int, Any]) -> int:
    return change[0]
