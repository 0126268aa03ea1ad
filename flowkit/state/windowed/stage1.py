"""Stage 1 of a windowed table: partials per source partition, and the watermark.

A source partition's agents ``add`` into its partial of each open window. When the
partition's watermark (largest event time seen minus grace) passes a window's end, the
window's partials go to the outbox, addressed to the partitions that own their keys, and
the window leaves stage 1. Markers announce the watermark to every owner. The worker
sends the outbox (``drain_outbox``) and the changelog (``drain_changes``) at checkpoints.

>>> from flowkit.windows import TumblingWindow
>>> stage = Stage1(TumblingWindow(10, grace=0), partitions=2, partition_of=lambda k: 0)
>>> stage.assign([0]); part = stage.parts[0]
>>> stage.window_for_add(part, 0, "k", 1)["k"] = 1   # add 1 to key k, window [0, 10 s)
>>> stage.advance(part, 10_000)                       # the watermark passes its end
>>> [(q, wire.decode(v)) for q, _, v in stage.drain_outbox()][:1]
[(0, ['p', 0, 0, 'k', 1])]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...windows import WindowSpec
from . import wire
from .stages import INF, NONE, Sources, idle_parts

__all__ = ["NONE", "Part", "Stage1", "idle_parts"]


class Part:
    """Stage-1 state of one source partition."""

    __slots__ = (
        "active",
        "changed",
        "dirty",
        "hot",
        "hot_end",
        "hot_start",
        "hot_top",
        "logged",
        "max_ts",
        "next_end",
        "number",
        "partials",
        "sent_wm",
        "wm",
    )

    def __init__(self, number: int, updates: bool = False) -> None:
        self.number = number
        # With running updates: the (window start, key) pairs changed since the last
        # flush, shipped to their owners then; None when the table emits on close only.
        self.changed: set[tuple[int, Any]] | None = set() if updates else None
        self.partials: dict[int, dict[Any, Any]] = {}  # window start -> key -> partial
        self.wm = NONE
        self.max_ts = NONE
        self.next_end = INF  # the earliest end among open windows
        self.sent_wm = NONE  # the watermark last announced to the owners
        self.active = -1.0  # when the partition went quiet (monotonic), or -1 if not quiet
        self.dirty: set[int] = set()  # windows changed since the last changelog flush
        self.logged: tuple[int, ...] | None = None
        # The window the last add() went to, already open and in ``dirty``: consecutive
        # records mostly fall in the same window. Forgotten whenever ``dirty`` is cleared
        # or a window leaves ``partials``. ``hot_top`` is the highest time add() may put
        # there without a look at the watermark: min(max_ts, hot_end - 1).
        self.hot_start = self.hot_end = NONE
        self.hot_top = NONE - 1
        self.hot: dict[Any, Any] = {}

    def forget_hot(self) -> None:
        self.hot_start = self.hot_end = NONE  # no time is in [NONE, NONE)
        self.hot_top = NONE - 1  # nor in [NONE, NONE - 1]
        self.hot = {}


class Stage1(Sources[Part]):
    """One worker's stage-1 state of one tumbling or hopping table: its source
    partitions (``Sources``), each a ``Part`` of open windows' partials."""

    def __init__(
        self,
        spec: WindowSpec,
        *,
        partitions: int,
        partition_of: Callable[[Any], int],
        encode_key: Callable[[Any], bytes] = wire.encode,
        now_ms: Callable[[], int] = lambda: 0,
        name: str = "table",
        updates: bool = False,
    ) -> None:
        super().__init__(
            spec,
            Part,
            partitions=partitions,
            partition_of=partition_of,
            encode_key=encode_key,
            now_ms=now_ms,
            name=name,
            updates=updates,
        )
        self.size = spec.size_ms
        self._shipped: list[tuple[int, int, list[Any]]] = []  # (partition, start, keys)

    # -- adds -----------------------------------------------------------------------------

    def window_for_add(self, part: Part, start: int, key: Any, amount: Any) -> dict[Any, Any]:
        """The open window at ``start``, marked dirty and made hot. The caller has checked
        that the window is not closed (``is_closed``)."""
        window = part.partials.get(start)
        if window is None:
            window = self.open(part, start)
        part.dirty.add(start)
        part.hot_start, part.hot_end, part.hot = start, start + self.size, window
        part.hot_top = min(part.max_ts, start + self.size - 1)
        return window

    def is_closed(self, part: Part, start: int) -> bool:
        """True when the window at ``start`` already closed on ``part``."""
        return start + self.size <= part.wm

    def open(self, part: Part, start: int) -> dict[Any, Any]:
        """A new empty window at ``start``."""
        window: dict[Any, Any] = {}
        part.partials[start] = window
        end = start + self.size
        if end < part.next_end:
            part.next_end = end
        return window

    def advance(self, part: Part, ts: int) -> None:
        """Event time ``ts`` (newer than any seen) moves ``part``'s watermark."""
        if ts > self.future_limit:
            self.check_future(ts)
        part.max_ts = ts
        wm = ts - self.spec.grace_ms
        if wm > part.wm:
            part.wm = wm
            if wm >= part.next_end:
                self.close_partials(part)

    def set_wm(self, part: Part, wm: int) -> None:
        """Move ``part``'s watermark to ``wm`` (if later), shipping what it closes."""
        if wm > part.wm:
            part.wm = wm
            if wm >= part.next_end:
                self.close_partials(part)

    def close_partials(self, part: Part) -> None:
        """Ship every window that ended at or before the watermark to its owners."""
        wm = part.wm
        size = self.size
        p = part.number
        next_end = INF
        part.forget_hot()
        for start in sorted(part.partials):
            if start + size > wm:
                next_end = min(next_end, start + size)
                continue
            window = part.partials.pop(start)
            for key, value in window.items():
                q = self._partition_of(key)
                self._outbox.append((q, self._encode_key(key), wire.partial(start, p, key, value)))
            self._shipped.append((p, start, list(window)))
            part.dirty.discard(start)
        part.next_end = next_end

    def local(self, key: Any) -> dict[int, dict[int, Any]]:
        """``key``'s partials in the source partitions held here: start -> source -> value."""
        local: dict[int, dict[int, Any]] = {}
        for p, part in self.parts.items():
            for start, window in part.partials.items():
                if key in window:
                    local.setdefault(start, {})[p] = window[key]
        return local

    # -- the worker's side ----------------------------------------------------------------

    def ship_updates(self) -> None:
        # Running updates: the current partial of each (window, key) changed since the
        # last flush, once per flush however many records changed it. The owner keeps
        # one partial per source, so a partial shipped again replaces the one before.
        for p, part in self.parts.items():
            changed = part.changed
            if not changed:
                continue
            for start, key in sorted(changed, key=_window_first):
                window = part.partials.get(start)
                if window is not None and key in window:  # else: closed, shipped already
                    q = self._partition_of(key)
                    self._outbox.append(
                        (q, self._encode_key(key), wire.partial(start, p, key, window[key]))
                    )
            changed.clear()

    def drain_changes_into(self, out: list[tuple[int, bytes, bytes | None]]) -> None:
        """Append stage 1's changelog records since the last drain to ``out``."""
        for p, start, keys in self._shipped:
            for key in keys:
                out.append((p, wire.partial_key(start, key), None))
        self._shipped = []
        for p, part in self.parts.items():
            for start in part.dirty:
                for key, value in part.partials.get(start, {}).items():
                    out.append((p, wire.partial_key(start, key), wire.encode(value)))
            part.dirty.clear()
            part.forget_hot()
            self.log_watermark(part, out)

    def apply_record(self, part: Part, kind: str, parts: list[Any], value: Any) -> None:
        """Apply one decoded changelog record of stage 1 (``kind`` "w" or "p")."""
        if kind == "w":
            self.apply_watermark(part, value)
            return
        start, key = parts[1], wire.key_from_json(parts[2])
        if value is None:
            part.partials.get(start, {}).pop(key, None)
        else:
            part.partials.setdefault(start, {})[key] = value

    def recovered(self, part: Part) -> None:
        """Tidy ``part`` after its changelog was applied. A stream time there beyond
        ``max_future`` (an older version's, or a wrong clock's) starts again: what it
        closed is shipped, and it must not make every record late."""
        self.trust_watermark(part)
        for start in [s for s, v in part.partials.items() if not v]:
            del part.partials[start]
        part.next_end = min((s + self.size for s in part.partials), default=INF)
        part.forget_hot()


def _window_first(change: tuple[int, Any]) -> int:
    return change[0]
