"""Progress of a table recovery: records read, records left, rate.

``StateKeeper`` reads changelogs to their high watermark when partitions are assigned;
``RecoveryProgress`` watches that reading once per batch (never per record) so that
``/metrics``, the web page and the console can say how far it got. Records left are
what the fetches' high watermarks say is still ahead of the consumer's positions.

``collector_paused`` keeps Python's cyclic garbage collector off while changelogs are read:
a recovery allocates millions of short-lived, acyclic objects (the Kafka client's records),
and the collector walking them cost about a fifth of its CPU time.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Iterator

import structlog

from ..records import Message, TopicPartition
from ..transports import Consumer
from ..transports.reading import Apply

__all__ = ["RecoveryProgress", "collector_paused"]

log = structlog.get_logger(__name__)

Listener = Callable[["RecoveryProgress"], None]


class RecoveryProgress:
    """Counts of the table recoveries of one worker (the current one and past ones)."""

    def __init__(self) -> None:
        self.done = 0  # records read, all recoveries together
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

        def counted(tp: TopicPartition, messages: list[Message]) -> None:
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


_pauses = 0  # recoveries under way in this process (several workers may recover at once)
_was_enabled = False  # the collector's state before the first of them paused it


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector off while the block runs (reference counting still
    frees everything acyclic at once); back as it was when the last such block ends.

    Reading a changelog from Kafka makes an object the collector tracks for every record
    (aiokafka's ``ConsumerRecord``), and a batch holds tens of thousands of them until it is
    applied: the collector walked them again and again, 0.56-0.73 s of CPU per million
    records, a fifth of the recovery. Cycles made meanwhile (by agents of partitions already
    held) are collected once the recovery ends.
    """
    global _pauses, _was_enabled
    if _pauses == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()
