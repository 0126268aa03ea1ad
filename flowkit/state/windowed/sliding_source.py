"""Stage 1 of a sliding table: each source partition's stream time, and its records on
their way to the partition that owns their key.

Why records, not partials: a sliding window's bounds are set by the key's records (one
window ends at each record, one starts just after each), so which windows exist depends on
every record of the key, from every source partition. Partials per window, as tumbling
tables ship, would need each source to know the others' records. So a source ships each
record's ``(time, value)`` to the owner, which holds the key's records for ``size +
grace`` and computes every window exactly (``sliding_owner.py``). That is one repartition
record per added record, sent in batches at each flush; nothing else is kept here.

Each shipped record carries the source's watermark when it was added and a sequence
number: the owner closes what that watermark closes before it adds the record (so on one
partition the result is exactly Kafka Streams'), and ignores a record it has already
applied (a replay after a restart). A record whose every window has closed on its
partition (``ts + size`` before stream time minus ``grace``) is late, as in Kafka Streams.

>>> from flowkit.windows import SlidingWindow
>>> src = SlidingSource(SlidingWindow(10, grace=0), partitions=1, partition_of=lambda k: 0)
>>> src.assign([0]); part = src.parts[0]
>>> for ts in (30_000, 12_000, 25_000):
...     src.advance(part, ts) if ts > part.max_ts else None
...     print(src.add(part, "k", ts, 1))
True
False
True
>>> [wire.decode(v) for _, _, v in src.drain_outbox()][:2]
[['p', 30000, 0, 'k', [1, 30000, 1]], ['p', 25000, 0, 'k', [1, 30000, 2]]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...windows import SlidingSpec
from . import wire
from .stages import NONE, Change, Sources

__all__ = ["SlidingPart", "SlidingSource"]


class SlidingPart:
    """Stage-1 state of one source partition of a sliding table."""

    __slots__ = (
        "active",
        "changed",
        "indexed",
        "logged",
        "max_ts",
        "number",
        "outbox",
        "sent_wm",
        "seq",
        "unsent",
        "wm",
    )

    def __init__(self, number: int, updates: bool = False) -> None:
        self.number = number
        # Running updates are found by the owner, which sees every record: none here.
        self.changed: set[Any] | None = None
        self.wm = NONE  # stream time minus grace
        self.max_ts = NONE
        self.sent_wm = NONE
        self.seq = 0  # records shipped from this partition, ever: the owner's replay check
        self.active = -1.0  # when the partition went quiet (monotonic), or -1
        self.logged: tuple[int, ...] | None = None
        # (key, ts, amount, watermark, seq) added since the last flush, in order.
        self.outbox: list[tuple[Any, int, Any, int, int]] = []
        # For reads: the outbox by key, brought up to date when read (``unsent``), so an
        # add does nothing more and a read costs the records added since the last read.
        self.unsent: dict[Any, list[list[Any]]] = {}
        self.indexed = 0

    def unsent_of(self, key: Any) -> list[list[Any]]:
        """``key``'s records in the outbox, ``[time, value]`` in the order they were added."""
        outbox = self.outbox
        if self.indexed < len(outbox):
            unsent = self.unsent
            for k, ts, amount, _, _ in outbox[self.indexed :]:
                found = unsent.get(k)
                if found is None:
                    unsent[k] = [[ts, amount]]
                else:
                    found.append([ts, amount])
            self.indexed = len(outbox)
        return self.unsent.get(key, [])


class SlidingSource(Sources[SlidingPart]):
    """One worker's stage-1 state of one sliding table: its source partitions
    (``Sources``), each a ``SlidingPart`` of the records on their way to their owners."""

    def __init__(
        self,
        spec: SlidingSpec,
        *,
        partitions: int,
        partition_of: Callable[[Any], int],
        encode_key: Callable[[Any], bytes] = wire.encode,
        now_ms: Callable[[], int] = lambda: 0,
        name: str = "table",
    ) -> None:
        super().__init__(
            spec,
            SlidingPart,
            partitions=partitions,
            partition_of=partition_of,
            encode_key=encode_key,
            now_ms=now_ms,
            name=name,
        )
        self.size = spec.size_ms

    # -- adds -----------------------------------------------------------------------------

    def add(self, part: SlidingPart, key: Any, ts: int, amount: Any) -> bool:
        """Ship a record of ``key`` at ``ts``; False when it is late (every window it
        would enter has closed). The caller has moved stream time to ``ts``."""
        if ts + self.size < part.wm:
            return False
        part.seq += 1
        part.outbox.append((key, ts, amount, part.wm, part.seq))
        return True

    def set_wm(self, part: SlidingPart, wm: int) -> None:
        """Move ``part``'s watermark to ``wm`` if later (owners learn it at the flush)."""
        if wm > part.wm:
            part.wm = wm

    # -- the worker's side ----------------------------------------------------------------

    def drain_outbox(self) -> list[tuple[int, bytes | None, bytes]]:
        """Records, then watermark markers, to send: (partition, key, value). Each
        partition's records go ahead of its marker, as they were added."""
        for p, part in self.parts.items():
            self._ship(p, part)
            if self.announce(part):
                self.mark(p, part)
        out, self._outbox = self._outbox, []
        return out

    def _ship(self, p: int, part: SlidingPart) -> None:
        partition_of, encode_key = self._partition_of, self._encode_key
        for key, ts, amount, wm, seq in part.outbox:
            value = wire.partial(ts, p, key, [amount, wm, seq])
            self._outbox.append((partition_of(key), encode_key(key), value))
        part.outbox.clear()
        part.unsent.clear()
        part.indexed = 0

    def has_outbox(self) -> bool:
        """True when records or markers wait to be sent."""
        return any(part.outbox for part in self.parts.values()) or super().has_outbox()

    @property
    def marker_step(self) -> int:
        # A marker when the watermark has moved into a new span of ``size``: an owner
        # learns a source's watermark with each record it gets from it, and the others'
        # at most one size late, at one marker per size of stream time, not per flush.
        return self.size

    # -- the changelog --------------------------------------------------------------------

    def drain_changes_into(self, out: list[Change]) -> None:
        """Append stage 1's changelog records since the last drain: each partition's
        watermark, stream time, announced watermark and sequence number."""
        for p, part in self.parts.items():
            state = (part.wm, part.max_ts, part.sent_wm, part.seq)
            if part.wm != NONE and part.logged != state:
                part.logged = state
                out.append((p, wire.WATERMARK_KEY, wire.encode(state)))

    def apply_record(self, part: SlidingPart, kind: str, parts: list[Any], value: Any) -> None:
        """Apply stage 1's changelog record (``kind`` "w"; None: deleted)."""
        if value is not None:
            part.wm, part.max_ts, part.sent_wm, part.seq = value
            part.logged = tuple(value)

    def recovered(self, part: SlidingPart) -> None:
        """A stream time beyond ``max_future`` in the changelog starts again (the sequence
        goes on: the owner has seen it)."""
        self.trust_watermark(part)
