"""What a ``rocksdb://`` store holds in RocksDB's memtables only (and so what a restart
after a kill -9 replays from its write-ahead log): after every checkpoint, never more
than the flush budget of ``flowkit.state.memtables``, as RocksDB itself counts it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.records import Message
from flowkit.state.databases import open_rocksdict
from flowkit.state.joins import StreamJoin
from flowkit.state.joins.rocks import RocksJoinStore
from flowkit.state.local import Stamp
from flowkit.state.memtables import FEW, SHARE
from flowkit.state.rocks import RocksTableStore
from flowkit.state.windowed.disk import CLOSED, DiskPart, start
from flowkit.state.windowed.session_disk import SessionDisk

T0 = 1_700_000_000_000


def counts_store(data_dir: Path) -> tuple[Any, RocksTableStore[str, int]]:
    app = flowkit.App("mem", partitions=1, store="rocksdb://")
    table = app.table("counts", default=int, value_type=int)
    return table, RocksTableStore(table, data_dir=data_dir, broker="memory://")


def in_memtables(store: RocksTableStore[Any, Any], partition: int = 0) -> int:
    """Entries of the partition's database not on disk, as RocksDB counts them."""
    db = store._parts[partition].db
    return sum(
        int(db.property_int_value(f"rocksdb.num-entries-{which}-mem-table{s}") or 0)
        for which, s in (("active", ""), ("imm", "s"))
    )


def keys_of(store: RocksTableStore[Any, Any], partition: int = 0) -> int:
    return int(store._parts[partition].db.property_int_value("rocksdb.estimate-num-keys") or 0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recovered=st.integers(0, 6_000),
    checkpoints=st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 8_000)), max_size=6),
)
def test_after_each_checkpoint_the_memtables_hold_less_than_the_budget(
    tmp_path_factory: Any, recovered: int, checkpoints: list[tuple[int, int]]
) -> None:
    # A recovery writes ``recovered`` keys, then each checkpoint changes ``n`` keys
    # among the first ``span`` (new ones as well as old).
    table, store = counts_store(tmp_path_factory.mktemp("db"))
    store.assign([0])
    encode = table.value_codec.encode
    changelog = [
        Message("c", 0, i, 0, table.encode_key(f"k{i}"), encode(1)) for i in range(recovered)
    ]
    store.apply_changelog(0, changelog)
    offset = recovered
    for n, span in checkpoints:
        writer = store.writable(0, "")
        for i in range(n):
            key = f"k{(i * 7919) % max(span, 1)}"
            writer[key] = store[key] + 1
        offset += len(store.drain_changes())
        store.persist({0: offset})
        entries, keys = in_memtables(store), keys_of(store)
        assert entries < FEW or entries * SHARE < keys, (entries, keys)
    store.aclose()


def within_budget(db: Any) -> bool:
    entries = sum(
        int(db.property_int_value(f"rocksdb.num-entries-{which}-mem-table{s}") or 0)
        for which, s in (("active", ""), ("imm", "s"))
    )
    keys = int(db.property_int_value("rocksdb.estimate-num-keys") or 0)
    return entries < FEW or entries * SHARE < keys


def test_a_session_tables_database_keeps_to_the_budget(tmp_path: Path) -> None:
    stamp = Stamp(app="a", table="t", partition=0, partitions=1, broker="m", format=103)
    disk = SessionDisk.open(open_rocksdict(), tmp_path / "db", stamp, "t", lock_tries=1)
    try:
        for checkpoint in range(3):
            for i in range(1_500):
                disk.put(b"C%d-%d" % (checkpoint, i), b"[]")
            disk.drain()
            disk.persist(checkpoint + 1)
            assert within_budget(disk.db)
    finally:
        disk.close()


def test_a_joins_database_keeps_to_the_budget(tmp_path: Path) -> None:
    left: flowkit.Topic[int] = flowkit.App("t").topic("l", value_type=int)
    right: flowkit.Topic[int] = flowkit.App("t").topic("r", value_type=int)
    join = StreamJoin(left, right, name="j", app_name="t", within=3600.0, grace=3600.0)
    store = RocksJoinStore(join, lambda: T0, data_dir=tmp_path, broker="memory://")
    store.assign([0])
    try:
        part = store.part(0)
        for checkpoint in range(3):
            for i in range(1_500):
                offset = checkpoint * 1_500 + i
                key = b"k%d" % offset
                store.process(part, 0, key, offset, T0 + offset, b"1", 1)
            store.drain_changes()
            store.persist({0: (checkpoint + 1) * 1_500})
            assert within_budget(part.db)
    finally:
        store.aclose()


def test_a_windowed_tables_database_keeps_to_the_budget(tmp_path: Path) -> None:
    stamp = Stamp(app="a", table="t", partition=0, partitions=1, broker="m", format=101)
    disk = DiskPart.open(open_rocksdict(), tmp_path / "db", stamp, "t", lock_tries=1)
    try:
        for checkpoint in range(3):
            for i in range(1_500):
                disk.put(CLOSED + start(checkpoint * 10_000) + b'"k%d"' % i, b"1")
            disk.drain()
            disk.persist(checkpoint + 1)
            assert within_budget(disk.db)
    finally:
        disk.close()
