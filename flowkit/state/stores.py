"""The state of a table in one worker: a store per table declaration per worker.

A worker builds its stores when it starts (``table.new_store(...)``), fills them from the
changelogs as partitions are assigned, and drains their changes at every checkpoint. Two
workers over one App hold two sets of stores, so they never see each other's state.

>>> import flowkit
>>> app = flowkit.App("shop")
>>> totals = app.table("totals", default=int)
>>> store = totals.new_store(now_ms=lambda: 0)
>>> store.assign([0]); store.writable(0, "a")["a"] = 5
>>> store["a"], store["b"], store.drain_changes()
(5, 0, [(0, b'a', b'5')])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import DecodeError, NotRunningError
from ..records import Message
from ..streamtime import FutureGuard
from .expiry import ExpiryIndex
from .refusals import keyless

if TYPE_CHECKING:
    from .tables import GlobalTable, Table

__all__ = ["Change", "GlobalStore", "TableStore", "TimedChange"]

Change = tuple[int, bytes, bytes | None]
"""A changelog record to send: (partition, key, value or None for a delete)."""
TimedChange = tuple[int, bytes, bytes | None, int]
"""The same, with the key's write time (ms), for tables whose keys expire: the
changelog record's timestamp, so that a rebuild knows when each key was written."""

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


class TableStore(Generic[K, V]):
    """A partitioned table's state in one worker: a dict per held partition."""

    def __init__(self, table: Table[K, V], *, now_ms: Callable[[], int] = lambda: 0) -> None:
        # Changelog records that do not decode (anyone with produce rights can write the
        # topic): the worker dead-letters them (``take_rejected``); the key keeps its value.
        self.rejected: list[tuple[Message, Exception]] = []
        self.table = table
        self._data: dict[int, dict[K, V]] = {}
        self._dirty: dict[int, set[K]] = {}
        # Key expiry (a table with ttl=): per partition, each live key's last write time,
        # the keys by when they are due, and the clock they are due on (stream time).
        self.ttl: int | None = table.ttl_ms
        self.wall = table.ttl_clock == "wall"
        self.now_ms = now_ms
        self.guard = FutureGuard(table.max_future_ms, now_ms=now_ms, owner=f"table {table.name!r}")
        self.expired = 0  # keys expired by this store
        self._written: dict[int, dict[K, int]] = {}
        self._index: dict[int, ExpiryIndex] = {}
        self._clock: dict[int, int] = {}

    # -- reads ----------------------------------------------------------------------------

    def __getitem__(self, key: K) -> V:
        data = self._data.get(self.table.partition_of(key))
        if data is not None and key in data:
            return data[key]
        default = self.table.default
        if default is None:
            raise KeyError(key)
        return default()

    def __contains__(self, key: object) -> bool:
        data = self._data.get(self.table.partition_of(key))  # type: ignore[arg-type]
        return data is not None and key in data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default`` (the table's default is not used)."""
        data = self._data.get(self.table.partition_of(key))
        if data is None:
            return default
        return data.get(key, default)

    def __iter__(self) -> Iterator[K]:
        for data in list(self._data.values()):
            yield from list(data)

    def __len__(self) -> int:
        return sum(len(d) for d in self._data.values())

    def items(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs of the partitions this worker holds."""
        for data in list(self._data.values()):
            yield from list(data.items())

    # -- writes ---------------------------------------------------------------------------

    def writable(self, partition: int, key: K) -> dict[K, V]:
        """The dict of ``partition``, with ``key`` marked changed (to the changelog at the
        next checkpoint)."""
        data = self._data.get(partition)
        if data is None:
            raise NotRunningError(
                f"table {self.table.name!r}: partition {partition} is not assigned to this worker"
            )
        dirty = self._dirty.get(partition)
        if dirty is None:
            dirty = self._dirty[partition] = set()
        dirty.add(key)
        return data

    # -- the worker's side ----------------------------------------------------------------

    def touch(self, partition: int, key: K, ms: int | None) -> None:
        """``key`` of ``partition`` was written at event time ``ms`` (None: at the
        partition's stream time), for a table whose keys expire."""
        now = self._clock.get(partition, 0)
        if ms is None:  # no stream time yet (no record read): the wall clock's
            ms = now or self.now_ms()
        elif ms > now:
            self._clock[partition] = ms
        written = self._written.get(partition)
        if written is None:
            written = self._written[partition] = {}
        written[key] = ms

    def advance(self, partition: int, ms: int) -> None:
        """Move the stream time of ``partition`` to ``ms`` (it never moves back)."""
        if ms > self._clock.get(partition, 0):
            self._clock[partition] = ms

    def assign(self, partitions: Iterable[int]) -> None:
        """Start holding these partitions (empty until recovered)."""
        for p in partitions:
            self._data.setdefault(p, {})

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop these partitions' state (after the final flush)."""
        for p in partitions:
            self._data.pop(p, None)
            self._dirty.pop(p, None)
            self._forget_times(p)

    def _forget_times(self, partition: int) -> None:
        self._written.pop(partition, None)
        self._index.pop(partition, None)
        self._clock.pop(partition, None)

    def held(self) -> set[int]:
        """Partitions this worker holds."""
        return set(self._data)

    def dirty(self, partition: int) -> bool:
        """True when ``partition`` changed since the last drain."""
        return bool(self._dirty.get(partition))

    def partition_data(self, partition: int) -> dict[K, V] | None:
        """The dict of ``partition`` (for a snapshot), or None if not held."""
        return self._data.get(partition)

    def partition_times(self, partition: int) -> list[int]:
        """The write times of ``partition``'s keys, in the order of its dict (for a
        snapshot); empty for a table whose keys do not expire."""
        if self.ttl is None:
            return []
        written = self._written.get(partition, {})
        return [written.get(k, 0) for k in self._data.get(partition, {})]

    def load(
        self, partition: int, keys: list[Any], values: list[Any], times: Sequence[int] = ()
    ) -> None:
        """Fill ``partition`` with these keys and values (a snapshot's, decoded), and, for
        a table whose keys expire, their write times (``DecodeError`` if they do not pair
        up: the snapshot is then not used)."""
        if len(keys) != len(values):
            raise DecodeError("a snapshot has as many keys as values")
        if self.ttl is not None and len(times) != len(keys):
            raise DecodeError("a snapshot of a table with ttl= has a write time per key")
        data = self._data.get(partition)
        if data:
            data.update(zip(keys, values, strict=True))
        else:  # built in one go (a snapshot holds millions)
            self._data[partition] = dict(zip(keys, values, strict=True))
        if self.ttl is not None:
            self._written[partition] = dict(zip(keys, times, strict=True))
            self._index[partition] = index = ExpiryIndex()
            index.rebuild(self._written[partition], self.ttl)
            if times:
                self.advance(partition, max(times))

    def adopt(self, partition: int, data: dict[K, V]) -> None:
        """Hold ``partition`` with ``data`` as its state, unchanged (a standby's copy)."""
        self._data[partition] = data
        self._dirty.pop(partition, None)

    def hand_over(self, partition: int, to: TableStore[K, V]) -> None:
        """Move ``partition``'s state (its dict, and its keys' write times) to ``to``, a
        store of the same table: a standby copy becomes the owner's state, not copied."""
        to._data[partition] = self._data.pop(partition, {})
        to._dirty.pop(partition, None)
        self._dirty.pop(partition, None)
        _move(self._written, to._written, partition)
        _move(self._index, to._index, partition)
        _move(self._clock, to._clock, partition)

    def reset(self, partition: int) -> None:
        """Empty ``partition`` (it is rebuilt from the changelog)."""
        self._data[partition] = {}
        self._dirty.pop(partition, None)
        self._forget_times(partition)

    def sizes(self) -> dict[int, int]:
        """Keys per held partition."""
        return {p: len(d) for p, d in list(self._data.items())}

    def apply_changelog(self, partition: int, messages: Sequence[Message]) -> None:
        """Rebuild state from changelog records (None value = deleted)."""
        data = self._data.setdefault(partition, {})
        decode = self.table.value_codec.decode
        key_decode = self.table.key_codec.decode
        if self.ttl is not None:
            self._apply_timed(partition, data, messages)
            return
        if _apply_fast(data, messages, self.table.key_codec, self.table.value_codec):
            return
        _apply(data, messages, key_decode, decode, self.rejected)

    def _apply_timed(self, partition: int, data: dict[K, V], messages: Sequence[Message]) -> None:
        """``apply_changelog`` for a table whose keys expire: each record's timestamp is
        its key's write time, and the latest of them the partition's stream time."""
        assert self.ttl is not None
        ttl = self.ttl
        written = self._written.get(partition)
        if written is None:
            written = self._written[partition] = {}
        index = self._index.get(partition)
        if index is None:
            index = self._index[partition] = ExpiryIndex()
        key_decode = self.table.key_codec.decode
        decode = self.table.value_codec.decode
        guard = self.guard
        clock = self._clock.get(partition, 0)
        for m in messages:
            if m.key is None:
                self.rejected.append((m, keyless()))
                continue
            at = int(m.timestamp)
            try:
                key = key_decode(m.key)
                if m.value is None:
                    data.pop(key, None)
                    written.pop(key, None)
                else:
                    data[key] = decode(m.value)
                    written[key] = at
                    index.add(key, at + ttl)
            except DecodeError as exc:
                self.rejected.append((m, exc))
                continue
            except TypeError as exc:
                self.rejected.append((m, _not_a_key(exc)))
                continue
            # A timestamp beyond the guard (anyone may write the topic) moves nothing.
            if at > clock and (at <= guard.future_limit or guard.admits(at)):
                clock = at
        if not self.wall:
            self.advance(partition, clock)
        index.compact(written, ttl)

    def drain_changes(self) -> list[Any]:
        """The latest value of every key changed since the last drain: (partition, key,
        value or None for a delete), with the write time (``TimedChange``) when keys
        expire; those keys whose time is up are deleted and drained as deletes too."""
        if self.ttl is not None:
            return self._drain_timed(self.ttl)
        out: list[Change] = []
        encode = self.table.value_codec.encode
        encode_key = self.table.encode_key
        for p, keys in self._dirty.items():
            data = self._data.get(p, {})
            for key in keys:
                value = data.get(key, _MISSING)
                out.append((p, encode_key(key), None if value is _MISSING else encode(value)))
        self._dirty = {}
        return out

    def _drain_timed(self, ttl: int) -> list[TimedChange]:
        out: list[TimedChange] = []
        encode = self.table.value_codec.encode
        encode_key = self.table.encode_key
        wall = self.now_ms() if self.wall else None
        for p, keys in self._dirty.items():
            data = self._data.get(p, {})
            written = self._written.get(p)
            if written is None:
                written = self._written[p] = {}
            index = self._index.get(p)
            if index is None:
                index = self._index[p] = ExpiryIndex()
            now = self._clock.get(p, 0) if wall is None else wall
            for key in keys:
                value = data.get(key, _MISSING)
                if value is _MISSING:
                    written.pop(key, None)
                    out.append((p, encode_key(key), None, now))
                    continue
                at = wall if wall is not None else written.get(key, now)
                written[key] = at
                index.add(key, at + ttl)
                out.append((p, encode_key(key), encode(value), at))
        self._dirty = {}
        self._sweep(ttl, wall, out)
        return out

    def _sweep(self, ttl: int, wall: int | None, out: list[TimedChange]) -> None:
        """Delete the keys whose time is up: only the index's due entries are looked at."""
        encode_key = self.table.encode_key
        for p, index in self._index.items():
            data = self._data.get(p)
            written = self._written.get(p)
            if data is None or written is None:
                continue
            now = self._clock.get(p, 0) if wall is None else wall
            for key, due in index.due(now):
                at = written.get(key)
                if at is None or at + ttl != due:
                    continue  # written again since, or deleted: a stale entry
                del written[key]
                data.pop(key, None)
                out.append((p, encode_key(key), None, now))
                self.expired += 1
            index.compact(written, ttl)


def _apply(
    data: dict[Any, Any],
    messages: Iterable[Message],
    key_decode: Callable[[bytes], Any],
    decode: Callable[[bytes], Any],
    rejected: list[tuple[Message, Exception]],
) -> None:
    """Apply changelog records to ``data`` (None value = deleted); a record that does not
    decode goes to ``rejected`` (the worker dead-letters it) and its key keeps its value."""
    for m in messages:
        if m.key is None:
            rejected.append((m, keyless()))
            continue
        try:
            key = key_decode(m.key)
            if m.value is None:
                data.pop(key, None)
            else:
                data[key] = decode(m.value)
        except DecodeError as exc:
            rejected.append((m, exc))
        except TypeError as exc:
            rejected.append((m, _not_a_key(exc)))


def _not_a_key(exc: TypeError) -> DecodeError:
    # A key that decodes to a list or an object (JSON has no tuples) is no dict key.
    return DecodeError(f"a changelog key does not decode to a table key: {exc}")


def _apply_fast(
    data: dict[Any, Any], messages: Sequence[Message], key_codec: Any, value_codec: Any
) -> bool:
    """Apply changelog records with the codecs' own C decoders (recovery reads millions);
    False when a codec has none or a record does not decode: the caller then applies the
    records again, in order (which gives the same state), with the error-mapping decoders."""
    fast_key = getattr(key_codec, "raw_decode", None)
    fast_value = getattr(value_codec, "raw_decode", None)
    if fast_key is None or fast_value is None:
        return False
    pop = data.pop
    try:
        for m in messages:
            key = m.key
            if key is None:
                return False  # refused by the caller's ``_apply``
            value = m.value
            if value is None:
                pop(fast_key(key), None)
            else:
                data[fast_key(key)] = fast_value(value)
    except Exception:
        return False
    return True


class GlobalStore(Generic[K, V]):
    """A global table's state in one worker: the whole topic as one dict."""

    def __init__(self, table: GlobalTable[K, V]) -> None:
        # Records of the table's topic that do not decode: dead-lettered by the worker.
        self.rejected: list[tuple[Message, Exception]] = []
        self.table = table
        self._data: dict[K, V] = {}
        # The dict itself and its own ``get``, for reads per record: a stream join's, and
        # ``GlobalTable[key]`` in an agent, without a Python frame of the store's.
        self.data = self._data
        self.fast_get: Callable[..., Any] = self._data.get

    def __getitem__(self, key: K) -> V:
        try:
            return self._data[key]
        except KeyError:
            if self.table.default is None:
                raise
            return self.table.default()

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default``."""
        return self._data.get(key, default)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> Iterator[tuple[K, V]]:
        """All (key, value) pairs."""
        return iter(list(self._data.items()))

    def apply_changelog(self, partition: int, messages: Iterable[Message]) -> None:
        """Apply records from the table's topic."""
        data = self._data
        topic = self.table.topic
        decode = topic.decode
        key_decode = topic.decode_key
        _apply(data, messages, key_decode, decode, self.rejected)


T = TypeVar("T")


def _move(mine: dict[int, T], theirs: dict[int, T], partition: int) -> None:
    """``partition``'s entry moves from ``mine`` to ``theirs`` (or leaves ``theirs``)."""
    if partition in mine:
        theirs[partition] = mine.pop(partition)
    else:
        theirs.pop(partition, None)
