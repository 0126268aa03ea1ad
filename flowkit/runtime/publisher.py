"""Everything a worker sends goes through its ``Publisher``: outputs, changelogs, partials,
dead letters. It keeps the unacknowledged sends, so a checkpoint can wait for them all
before it commits, and the end offset written per partition, so the worker knows when its
own writes to a topic it also reads have been read back (``is_idle``).

A send the broker refuses for good (``RecordRejected``, found when its ack fails) is handed
with its ``origin`` to ``on_rejected``, which applies the error policy of the record that
caused it; the sends that makes are awaited before the checkpoint goes on. A refused send
with no origin (a changelog write) is a ``TransportError``: the worker stops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import RecordRejected, TransportError
from ..records import Headers
from ..transports import Ack, Producer

__all__ = ["Publisher", "Rejected"]

MAX_IN_FLIGHT = 10_000  # unacknowledged sends before a sender waits (bounded memory)

Rejected = Callable[[Any, RecordRejected], Awaitable[None]]


class Publisher:
    """Sends encoded records through one producer and tracks their acknowledgements."""

    def __init__(self, producer: Producer, on_rejected: Rejected | None = None) -> None:
        self.producer = producer
        self.on_rejected = on_rejected
        self.sent_end: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset
        self._in_flight: list[Awaitable[Any]] = []
        self._origins: list[Any] = []  # beside _in_flight: what caused each send, or None

    @property
    def max_record_bytes(self) -> int | None:
        """The largest record the producer sends (key, value and headers), or None."""
        return self.producer.max_record_bytes

    async def send_bytes(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
        origin: Any = None,
    ) -> Awaitable[Any]:
        """Send encoded bytes; the ack is awaited before the next commit.

        Raises ``RecordRejected`` if the producer refuses the record at once (too large);
        if the broker refuses it later, ``on_rejected(origin, error)`` is called then.
        """
        ack = await self.producer.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        if isinstance(ack, Ack):  # already stored (the memory broker): nothing to await
            self._stored(ack)
            return ack
        self._in_flight.append(ack)
        self._origins.append(origin)
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            await self.await_acks()
        return ack

    def _stored(self, ack: Ack) -> None:
        # A plain tuple hashes and compares like the TopicPartition namedtuple.
        tp = (ack.topic, ack.partition)
        sent = self.sent_end
        if ack.offset >= sent.get(tp, 0):
            sent[tp] = ack.offset + 1

    async def await_acks(self) -> None:
        """Wait until every send so far is acknowledged or, if refused for good, handed to
        ``on_rejected`` (and what that sent is acknowledged too); raises
        ``TransportError`` for any other failed send."""
        while self._in_flight:
            pending, self._in_flight = self._in_flight, []
            origins, self._origins = self._origins, []
            rejected: list[tuple[Any, RecordRejected]] = []
            for ack, origin in zip(pending, origins, strict=True):
                if not isinstance(ack, Ack):  # an Ack is already stored; others are futures
                    try:
                        ack = await ack
                    except RecordRejected as exc:
                        if origin is None or self.on_rejected is None:
                            raise TransportError(f"a send was refused: {exc}") from exc
                        rejected.append((origin, exc))
                        continue
                    except Exception as exc:
                        raise TransportError(f"a send was not acknowledged: {exc!r}") from exc
                self._stored(ack)
            if not rejected:
                return
            assert self.on_rejected is not None
            for origin, refusal in rejected:
                await self.on_rejected(origin, refusal)  # its dead letters: awaited next round

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
                return False  # a failed send: the next checkpoint handles it
        return True
