"""Snapshots of a memory store: one file per table partition, stamped with the changelog
offset it reflects, each replacing the previous (written aside, then renamed over it).

A worker given a data directory writes a partition's snapshot when it gives the partition
up (a revocation, a clean stop) with nothing changed since its last checkpoint, and, with
``App(snapshot_interval=...)``, at a checkpoint at most that often: the state is taken when
the checkpoint takes the changes it sends, and written once the changelog holds them. On
the next assignment the worker loads the snapshot and replays only the changelog after its
offset.

>>> import tempfile, flowkit
>>> from pathlib import Path
>>> app = flowkit.App("shop")
>>> totals = app.table("totals", default=int)
>>> store = totals.new_store(now_ms=lambda: 0)
>>> store.assign([0]); store.writable(0, "a")["a"] = 5
>>> files = SnapshotFiles(Path(tempfile.mkdtemp()), broker="memory://")
>>> files.save(store, 0, offset=1)
>>> again = totals.new_store(now_ms=lambda: 0)
>>> files.load(again, 0), again["a"]
(1, 5)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog

from ..codecs import JsonCodec, MsgpackCodec, RawCodec, StrCodec
from ..errors import DecodeError
from .local import Stamp, partition_dir
from .stores import TableStore

__all__ = ["SnapshotFiles"]

log = structlog.get_logger(__name__)

NAME = "snapshot.msgpack"

Captured = tuple["_Column", "_Column", list[int]]
"""A partition's keys and values, each encoded as one column, and their write times
(empty without ttl=)."""


class _Column(msgspec.Struct, array_like=True):
    """A partition's keys, or its values, in order: ``data`` is one document holding them
    all, in the codec's own format where it is a msgspec one (``form`` names which), so a
    load decodes a column in one call; else (``items``) a msgpack list of each one's
    bytes, as the changelog has them."""

    form: str
    data: bytes


class _Snapshot(msgspec.Struct, array_like=True):
    stamp: bytes
    keys: _Column
    values: _Column
    times: list[int] = []  # each key's write time, for a table with ttl= (else empty)


_decoder = msgspec.msgpack.Decoder(_Snapshot)
_items = msgspec.msgpack.Decoder(list[bytes])


def _form(codec: Any) -> str:
    """How a column of ``codec``'s values is stored (the exact classes only: a subclass
    may encode otherwise)."""
    kind = type(codec)
    if kind is JsonCodec:
        return "json"
    if kind is MsgpackCodec:
        return "msgpack"
    if kind is StrCodec:
        return "str"
    if kind is RawCodec:
        return "raw"
    return "items"


def _encode_column(codec: Any, encode: Callable[[Any], bytes], objects: list[Any]) -> _Column:
    """``objects`` as one column: what ``encode`` gives each of them, in one document. A
    list of a msgspec codec's values encodes as each of them would, one after the other."""
    form = _form(codec)
    kinds = set(map(type, objects))
    if form in ("json", "msgpack") and any(issubclass(kind, bytes) for kind in kinds):
        form = "items"  # a bytes key is written as it is (``encode_key``), not encoded
    elif form == "str" and not kinds <= {str}:
        form = "items"  # encoded one by one: the codec's own error, as at a checkpoint
    if form == "json":
        return _Column(form, msgspec.json.encode(objects))
    if form != "items":  # msgpack, str and raw: a msgpack list
        return _Column(form, msgspec.msgpack.encode(objects))
    return _Column(form, msgspec.msgpack.encode([encode(o) for o in objects]))


def _decode_column(codec: Any, column: _Column) -> list[Any]:
    """The objects of ``column`` (a codec's or msgspec's error if it does not decode)."""
    form = column.form
    if form == "items":
        decode = getattr(codec, "raw_decode", None) or codec.decode
        return list(map(decode, _items.decode(column.data)))
    if form != _form(codec):
        raise DecodeError(f"a column is {form}, not {_form(codec)}")
    if form == "json":
        return msgspec.json.decode(column.data, type=list[codec.type])
    if form == "msgpack":
        return msgspec.msgpack.decode(column.data, type=list[codec.type])
    if form == "str":
        return msgspec.msgpack.decode(column.data, type=list[str])
    return _items.decode(column.data)


class SnapshotFiles:
    """Where a worker's memory stores keep their snapshots, and how they are read back."""

    def __init__(self, data_dir: Path, *, broker: str) -> None:
        self.data_dir = data_dir
        self.broker = broker

    def _path(self, store: TableStore[Any, Any], partition: int) -> Path:
        table = store.table
        return partition_dir(self.data_dir, table.app_name, table.name, partition) / NAME

    def _stamp(self, store: TableStore[Any, Any], partition: int) -> Stamp:
        return Stamp.of(store.table, partition, self.broker)

    def save(self, store: TableStore[Any, Any], partition: int, *, offset: int) -> None:
        """Write ``partition``'s state, reflecting the changelog up to ``offset``."""
        captured = self.capture(store, partition)
        if captured is not None:
            self.write(store, partition, captured, offset=offset)

    @staticmethod
    def capture(store: TableStore[Any, Any], partition: int) -> Captured | None:
        """``partition``'s keys, values and write times (a table with ttl=), encoded now
        (None if not held)."""
        data = store.partition_data(partition)
        if data is None:
            return None
        table = store.table
        return (
            _encode_column(table.key_codec, table.encode_key, list(data)),
            _encode_column(table.value_codec, table.value_codec.encode, list(data.values())),
            store.partition_times(partition),
        )

    def write(
        self,
        store: TableStore[Any, Any],
        partition: int,
        captured: Captured,
        *,
        offset: int,
    ) -> None:
        """Write what ``capture`` took, as reflecting the changelog up to ``offset``; it
        replaces the previous snapshot only once it is whole on disk."""
        keys, values, times = captured
        stamp = self._stamp(store, partition).with_offset(offset)
        snapshot = _Snapshot(stamp.encode(), keys, values, times)
        path = self._path(store, partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_suffix(".tmp")
        with aside.open("wb") as f:
            f.write(msgspec.msgpack.encode(snapshot))
            f.flush()
            os.fsync(f.fileno())
        os.replace(aside, path)

    def load(self, store: TableStore[Any, Any], partition: int) -> int | None:
        """Fill ``partition`` from its snapshot; the changelog offset it reflects, or None
        (nothing loaded) when there is none or it is not this partition's (one log line)."""
        path = self._path(store, partition)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._refuse(store, partition, path, f"it cannot be read ({exc})")
            return None
        try:
            snapshot = _decoder.decode(raw)
            stamp = Stamp.decode(snapshot.stamp)
        except msgspec.DecodeError as exc:
            self._refuse(store, partition, path, f"it does not decode ({exc})")
            return None
        why = self._stamp(store, partition).mismatch(stamp)
        if why is not None:
            self._refuse(store, partition, path, why)
            return None
        table = store.table
        try:
            keys = _decode_column(table.key_codec, snapshot.keys)
            if store.ttl is not None and len(snapshot.times) != len(keys):
                why = "it has no write times (it was written before the table had a ttl)"
                self._refuse(store, partition, path, why)
                return None
            values = _decode_column(table.value_codec, snapshot.values)
            store.load(partition, keys, values, snapshot.times)
        except Exception as exc:  # a codec's own error: the snapshot is not usable
            store.reset(partition)
            self._refuse(store, partition, path, f"a record does not decode ({exc})")
            return None
        return stamp.offset

    def _refuse(self, store: TableStore[Any, Any], partition: int, path: Path, why: str) -> None:
        log.warning(
            "local state not used; rebuilding from the changelog",
            table=store.table.name,
            partition=partition,
            path=str(path),
            reason=why,
        )
        path.unlink(missing_ok=True)
