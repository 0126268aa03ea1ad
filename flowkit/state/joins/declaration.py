"""A windowed join of two topics, with Kafka Streams' ``JoinWindows`` semantics.

``orders.join(payments, within=60.0, name="paid")`` pairs each order with each payment of
the same record key whose timestamps are at most 60 s apart (``before``/``after`` make the
window asymmetric: a payment ``t'`` matches an order ``t`` when ``t - before <= t' <= t +
after``). An agent over the join reads both topics and gets ``Joined(key, left, right,
timestamp)`` values:

* ``how="inner"``: a pair as soon as its second record arrives;
* ``how="left"``: also each order that found no payment, with ``right=None``, once its
  window has closed (stream time past ``t + after + grace``), never before;
* ``how="outer"``: also each unmatched payment, with ``left=None`` (past ``t' + before +
  grace``).

Stream time is per partition, shared by both topics: the largest timestamp read. A
record whose window has already closed is late and raises ``LateRecord`` (so it goes to
the dead-letter topic). A record stamped more than ``max_future`` (1 hour) ahead of the
wall clock raises ``FutureRecord`` and moves no stream time (``flowkit.streamtime``).
Both sides wait in buffers backed by the changelog ``<app>-<name>-changelog``, recovered
on assignment, and expire ``before + after + grace`` after their timestamp. The buffers are
in memory (``JoinStore``) or, with ``store="rocksdb://"`` (the join's or the app's), on
local disk (``RocksJoinStore``), where a restart replays only the changelog's tail. The two topics
must be co-partitioned (same partition count, same keys): ``flowkit graph --check`` says
so when they are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...arguments import non_negative_seconds
from ...durations import Seconds
from ...errors import DefinitionError
from ...streamtime import DEFAULT_MAX_FUTURE, max_future_ms
from ..base import TableBase
from ..local import StoreKind, check_store

if TYPE_CHECKING:
    from ...topics import Topic
    from .store import JoinStore

__all__ = ["HOW", "StreamJoin"]

HOW = ("inner", "left", "outer")


def _ms(value: Seconds | None, what: str, name: str) -> int:
    seconds = non_negative_seconds(value, f"join {name!r}: {what}")
    if not math.isfinite(seconds):
        raise DefinitionError(f"join {name!r}: {what} must be a finite number of seconds")
    return round(seconds * 1000)


class StreamJoin(TableBase[bytes, Any]):
    """A windowed join of ``left`` and ``right`` by record key. Declare it with
    ``left.join(right, within=..., name=...)`` and read it with ``@app.agent(join)``."""

    kind = "stream_join"

    def __init__(
        self,
        left: Topic[Any],
        right: Topic[Any],
        *,
        name: str,
        app_name: str,
        within: Seconds | None = None,
        before: Seconds | None = None,
        after: Seconds | None = None,
        grace: Seconds = 0.0,
        how: str = "inner",
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        store: str | None = None,
    ) -> None:
        if how not in HOW:
            raise DefinitionError(f"join {name!r}: how must be 'inner', 'left' or 'outer'")
        if within is None and (before is None or after is None):
            raise DefinitionError(f"join {name!r}: give within= (or both before= and after=)")
        super().__init__(
            name, app_name=app_name, partitions=left.partitions, key_type=bytes, value_type=Any
        )
        self.left = left
        self.right = right
        self.how = how
        self.before_ms = _ms(*((within, "within") if before is None else (before, "before")), name)
        self.after_ms = _ms(*((within, "within") if after is None else (after, "after")), name)
        self.grace_ms = _ms(grace, "grace", name)
        self.max_future_ms = max_future_ms(max_future, f"join {name!r}")
        # "memory://" or "rocksdb://" for the buffers; None: the app's (``App(store=...)``).
        self.store_kind: StoreKind | None = (
            None if store is None else check_store(store, f"join {name!r}")
        )

    @property
    def retention_ms(self) -> int:
        """How long after its timestamp a buffered record may still find a match."""
        return self.before_ms + self.after_ms + self.grace_ms

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "how": self.how,
            "left": self.left.name,
            "right": self.right.name,
            "before": self.before_ms / 1000,
            "after": self.after_ms / 1000,
            "grace": self.grace_ms / 1000,
        }

    def new_store(self, now_ms: Callable[[], int]) -> JoinStore:
        from .store import JoinStore

        return JoinStore(self, now_ms)

    def problems(self) -> list[str]:
        """What ``flowkit graph --check`` reports about this join."""
        left, right = self.left, self.right
        if left.partitions != right.partitions:
            return [
                f"join {self.name!r}: {left.name!r} ({left.partitions} partitions) and "
                f"{right.name!r} ({right.partitions} partitions) must be co-partitioned "
                "(same partition count, keyed by the join key)"
            ]
        return []
