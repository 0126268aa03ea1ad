"""Progress of a table recovery: records read, records left, rate.

``StateKeeper`` reads changelogs to their high watermark when partitions are assigned;
``RecoveryProgress`` watches that reading once per batch (never per record) so that
``/metrics``, the web page and the console can say how far it got. Records left are
what the fetches' high watermarks say is still ahead of the consumer's positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import structlog

from ...records import Message, TopicPartition
from ...transports import Consumer
from ...transports.reading import Apply

__all__ = ["RecoveryProgress"]

log = structlog.get_logger(__name__)

Listener = Callable[["RecoveryProgress"], None]


class RecoveryProgress:
    """Counts of the table recoveries of one worker (the current one and past ones)."""

    def __init__(self) -> None:
        self.done = 0  # records read, all recoveries together
        self.from_local = 0  # table partitions restored from local state (then the tail)
        self.from_standby = 0  # table partitions taken from a standby copy (then the gap)
        self.left = 0  # records still to read in the recovery under way
        self.active = False
        self.started = 0.0
        self.read = 0  # records read in the recovery under way
        self.listeners: list[Listener] = []  # called once per batch: the console's bar

    def rate(self) -> float:
        """Records per second of the recovery under way (0 when none is)."""
        if not self.active:
            return 0.0
        seconds = time.monotonic() - self.started
        return self.read / seconds if seconds > 0 else 0.0

    def watch(self, consumer: Consumer, tps: Iterable[TopicPartition], apply: Apply) -> Apply:
        """``apply`` wrapped to count each batch and refresh what is left."""
        partitions = list(tps)
        self.active = True
        self.started = time.monotonic()
        self.read = 0
        self.left = 0

        def counted(tp: TopicPartition, messages: Sequence[Message]) -> None:
            apply(tp, messages)
            self.read += len(messages)
            self.done += len(messages)
            left = 0
            for one in partitions:
                high = consumer.highwater(one)
                if high is not None:
                    left += max(high - consumer.position(one), 0)
            self.left = left
            for listener in self.listeners:
                listener(self)

        return counted

    def finish(self) -> None:
        """The recovery under way is over."""
        self.active = False
        self.left = 0
        for listener in self.listeners:
            listener(self)
