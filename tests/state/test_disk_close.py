"""The owner's close in steps on ``rocksdb://`` (disk_owner.py), against a plain-Python
model: partials and markers from two sources, checkpoints that each take one step of the
close (a cursor to the changelog, the results, the step's changes drained and written),
and crashes at every point of a checkpoint, after which the store opens again from its
database and the changelog's tail and the repartition records not committed come again.

What must hold: every (window, key) comes out with the fold of its partials; a result
that comes out again after a crash is marked as replayed; a key's windows come out in
the order of their starts; no step gives more than ``close_chunk`` results; and once
everything closed and expired, nothing of the windows is left on disk or in the changelog.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.records import Message
from flowkit.state.windowed import wire
from flowkit.state.windowed.disk import CLOSED, OWNED
from flowkit.state.windowed.disk_owner import DiskOwners
from flowkit.state.windowed.disk_store import DiskWindowedStore

pytest.importorskip("rocksdict")

SIZE = 10_000
NOW = 10**13  # the stores' clock: every event time here is in its past
T0 = 1_700_000_000_000
CRASHES = ("cursor", "emit", "stepped", "drained")  # where in a checkpoint the process dies
# Keys whose JSON begins another's ("a" and "ab", 1 and 12): a step that resumes past the
# last key it closed must not skip the longer one.
KEYS = ("a", "ab", "b", 1, 12, 123, 2)


class Run:
    """A disk store that owns partition 0 of a table fed by two source partitions."""

    def __init__(self, data_dir: Path, chunk: int) -> None:
        app = flowkit.App("close", partitions=2)
        self.table = app.table("counts", default=int).tumbling(10.0, grace=0.0, expires=10.0)
        self.data_dir = data_dir
        self.chunk = chunk
        self.changelog: dict[int, list[tuple[bytes, bytes | None]]] = {0: [], 1: []}
        self.repartition: list[bytes] = []  # what reached owner partition 0
        self.committed = 0  # its records committed (by a checkpoint)
        self.wm = [-(2**62), -(2**62)]  # each source's watermark, as sent
        self.truth: dict[tuple[int, Any], dict[int, int]] = {}  # (start, key) -> src -> v
        self.delivered: list[tuple[int, Any, int, bool]] = []  # (start, key, value, replayed)
        self.store = self.open()

    def open(self) -> DiskWindowedStore:
        store = DiskWindowedStore(self.table, lambda: NOW, data_dir=self.data_dir, broker="m")
        store.owners.close_chunk = self.chunk
        store.assign([0, 1])
        for p in (0, 1):
            at = store.local_offset(p) or 0
            tail = [
                Message("c", p, i, 0, k, v) for i, (k, v) in enumerate(self.changelog[p]) if i >= at
            ]
            if tail:
                store.apply_changelog(p, tail)
        assert not store.rejected
        return store

    def receive(self, raw: bytes) -> None:
        offset = len(self.repartition)
        self.repartition.append(raw)
        assert self.store.receive(0, [Message("r", 0, offset, 0, None, raw)]) == []

    def partial(self, src: int, window: int, key: Any, value: int) -> None:
        start = T0 + window * SIZE
        if start + SIZE <= self.wm[src]:
            return  # stage 1 sends no partial of a window it closed
        self.truth.setdefault((start, key), {})[src] = value
        self.receive(wire.partial(start, src, key, value))

    def marker(self, src: int, window: int) -> None:
        wm = T0 + window * SIZE
        if wm > self.wm[src]:
            self.wm[src] = wm
            self.receive(wire.marker(wm, src))

    def checkpoint(self, crash: str | None = None) -> None:
        """One checkpoint, as ``Checkpointer.checkpoint`` runs it: a step of each owned
        partition's close (``StateKeeper.close_windows``), the drain, the acknowledged
        changelog, the database written, the offsets committed; or a crash at ``crash``."""
        owners = self.store.owners
        assert isinstance(owners, DiskOwners)
        for q in (0, 1):
            step = owners.step(q)
            if step is None:
                continue
            assert len(step.again) + len(step.fresh) <= self.chunk
            record = owners.cursor_record(step)
            if record is not None:
                self.changelog[q].append(record)  # acknowledged before the results
            if crash == "cursor":
                return self.crash()
            results = [(r, True) for r in step.again] + [(r, False) for r in step.fresh]
            if crash == "emit":
                results = results[: len(results) // 2]
            for (key, window, value), replayed in results:
                self.delivered.append((window.start, key, value, replayed))
            if crash == "emit":
                return self.crash()
            owners.stepped(step)
        if crash == "stepped":
            return self.crash()
        for p, key, value in self.store.drain_changes():
            self.changelog[p].append((key, value))
        if crash == "drained":  # the changelog has it, the database does not
            return self.crash()
        self.store.persist({p: len(log) for p, log in self.changelog.items()})
        self.committed = len(self.repartition)

    def crash(self) -> None:
        """The process dies: the store opens again from disk and the changelog's tail,
        and the repartition records after the last commit come again."""
        self.store.aclose()
        self.store = self.open()
        again, self.repartition = (
            self.repartition[self.committed :],
            self.repartition[: self.committed],
        )
        for raw in again:
            self.receive(raw)

    def finish(self, crashes: list[str | None]) -> None:
        """Every window closes and expires, over ``crashes`` (one per checkpoint, then
        none); then the checks of the module's docstring."""
        self.marker(0, 10**6)
        self.marker(1, 10**6)
        for i in range(10_000):
            if not self.store.owners.closing():
                break
            self.checkpoint(crash=crashes[i] if i < len(crashes) else None)
        assert not self.store.owners.closing()
        self.checkpoint()
        firsts: dict[tuple[int, Any], int] = {}
        order: dict[Any, list[int]] = {}
        for start, key, value, replayed in self.delivered:
            parts = self.truth[start, key]
            want = parts[0] + parts[1] if len(parts) == 2 else next(iter(parts.values()))
            assert value == want, (start, key, value, parts)
            if (start, key) in firsts:
                assert replayed, f"{(start, key)} came out again, not marked as replayed"
            else:
                firsts[start, key] = value
                order.setdefault(key, []).append(start)
        assert firsts.keys() == self.truth.keys(), "a window's key never came out"
        for key, starts in order.items():
            assert starts == sorted(starts), f"{key!r}: windows out of order"
        live: dict[bytes, bytes | None] = {}
        for key, value in self.changelog[0]:
            live[key] = value
        left = [k for k, v in live.items() if v is not None and k[:5] in (b'["o",', b'["c",')]
        assert left == []
        owner = self.store.owners.owners[0]
        assert not owner.open_starts and not owner.closed_starts
        for kind in (OWNED, CLOSED):
            assert next(owner.disk.scan(kind), None) is None
        self.store.aclose()


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("partial"),
            st.integers(0, 1),
            st.integers(0, 2),
            st.sampled_from(KEYS),
            st.integers(1, 9),
        ),
        st.tuples(st.just("marker"), st.integers(0, 1), st.integers(0, 4)),
        st.tuples(st.just("checkpoint")),
        st.tuples(st.just("crash"), st.sampled_from(CRASHES)),
    ),
    max_size=60,
)


# Each example opens two databases (and again at each crash): 25 in CI, more with
# FLOWKIT_DISK_CLOSE_EXAMPLES.
@settings(
    max_examples=int(os.environ.get("FLOWKIT_DISK_CLOSE_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    ops=ops,
    chunk=st.integers(1, 3),
    crashes=st.lists(st.sampled_from([None, *CRASHES]), max_size=12),
)
def test_the_close_in_steps_gives_every_result_once_or_marked_over_crashes(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[Any, ...]],
    chunk: int,
    crashes: list[str | None],
) -> None:
    run = Run(tmp_path_factory.mktemp("close"), chunk)
    for op in ops:
        if op[0] == "partial":
            run.partial(op[1], op[2], op[3], op[4])
        elif op[0] == "marker":
            run.marker(op[1], op[2])
        elif op[0] == "checkpoint":
            run.checkpoint()
        else:
            run.checkpoint(crash=op[1])
    run.finish(crashes)


def test_a_step_that_ends_on_a_key_goes_on_with_a_longer_key_it_begins(
    tmp_path: Path,
) -> None:
    # 1, 12 and 123 sort together on disk ('1' < '12' < '123'), each key's entries
    # ending in 4 bytes of a source: the next step must start past 1's entries, not
    # past every key that begins with "1".
    run = Run(tmp_path, chunk=1)
    for key in (1, 12, 123, 2):
        run.partial(0, 0, key, 1)
    run.finish([])
    assert [key for _, key, _, _ in run.delivered] == [1, 12, 123, 2]
