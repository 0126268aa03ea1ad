"""Everything a worker sends goes through its ``Publisher``: outputs, changelogs, partials,
dead letters. It keeps the unacknowledged sends, so a checkpoint can wait for them all
before it commits, and the end offset written per partition, so the worker knows when its
own writes to a topic it also reads have been read back (``is_idle``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from ..errors import TransportError
from ..records import Headers
from ..transports import Ack, Producer

__all__ = ["Publisher"]

MAX_IN_FLIGHT = 10_000  # unacknowledged sends before a sender waits (bounded memory)


class Publisher:
    """Sends encoded records through one producer and tracks their acknowledgements."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.sent_end: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset
        self._in_flight: list[Awaitable[Any]] = []

    async def send_bytes(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Any]:
        """Send encoded bytes; the ack is awaited before the next commit."""
        ack = await self.producer.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if isinstance(ack, Ack):  # already stored (the memory broker): nothing to await
            self._stored(ack)
            return ack
        in_flight = self._in_flight
        in_flight.append(ack)
        if len(in_flight) >= MAX_IN_FLIGHT:
            await self.await_acks()
        return ack

    def _stored(self, ack: Ack) -> None:
        # A plain tuple hashes and compares like the TopicPartition namedtuple.
        tp = (ack.topic, ack.partition)
        sent = self.sent_end
        if ack.offset >= sent.get(tp, 0):
            sent[tp] = ack.offset + 1

    async def await_acks(self) -> None:
        """Wait until every send so far is acknowledged; raises ``TransportError`` for a
        send the broker refused."""
        pending, self._in_flight = self._in_flight, []
        for ack in pending:
            if not isinstance(ack, Ack):  # an Ack is already stored; others are futures
                try:
                    ack = await ack
                except Exception as exc:
                    raise TransportError(f"a send was not acknowledged: {exc!r}") from exc
            self._stored(ack)

    def all_acked(self) -> bool:
        """True when every send so far is acknowledged (and none failed)."""
        for ack in self._in_flight:
            if isinstance(ack, Ack):
                continue
            if not ack.done():  # type: ignore[attr-defined]
                return False
            try:
                self._stored(ack.result())  # type: ignore[attr-defined]
            except Exception:
                return False  # a failed send: the next checkpoint raises it
        return True
