"""``KafkaConsumer``: aiokafka's consumer behind the ``Consumer`` protocol.
``KafkaTransport`` makes it; it connects through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiokafka
import aiokafka.errors as kerr
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.protocol.group import HeartbeatRequest

from ...errors import CommitFailed, ConfigurationError, TransportError
from ...records import Message, TopicPartition
from ..base import RebalanceListener
from .draining import Drainer, send_next, usable
from .errors import KAFKA_ERRORS, map_kafka_errors, translate
from .loading import guard

if TYPE_CHECKING:
    from .transport import KafkaTransport

__all__ = ["KafkaConsumer"]

_KTP = aiokafka.TopicPartition


class _Bridge(ConsumerRebalanceListener):  # type: ignore[misc]
    """Called by aiokafka in its coordinator task; hands each call over to ``getmany``.

    The protocol runs listener callbacks inside ``getmany``, never while the caller is
    still processing a batch; aiokafka would run them concurrently, in its own task.
    """

    def __init__(self, consumer: KafkaConsumer) -> None:
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if revoked:  # aiokafka reports an empty revocation before the first join
            await self._consumer.hand_over("revoked", revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        # The generation the partitions were given in, taken now: aiokafka resets its own
        # to "none" when it learns that the group went on without this member, and offsets
        # sent with "none" are not checked at all.
        client = self._consumer.client
        if client is None:  # closed meanwhile (the worker stops): nothing to take over
            return
        coordinator = client._coordinator  # noqa: SLF001 (aiokafka, see draining.py)
        self._consumer.generation = (coordinator.generation, coordinator.member_id)
        await self._consumer.hand_over("assigned", assigned)


class KafkaConsumer:
    """An ``AIOKafkaConsumer`` behind the ``Consumer`` protocol (auto-commit off).

    The aiokafka client is made in ``start`` (it needs the running loop), or by the first
    ``getmany``/``commit``/``committed``; ``subscribe`` and ``assign`` called before that
    are replayed then. Closing leaves the group without a revocation callback: commit
    before ``aclose``.
    """

    def __init__(self, transport: KafkaTransport, options: dict[str, Any]) -> None:
        self._transport = transport
        self._options = options
        self.group_id: str | None = options["group_id"]
        self._kafka: Any = None
        self._replay: list[Callable[[], None]] = []
        self._listener: RebalanceListener | None = None
        self._owned: set[TopicPartition] = set()
        # Rebalance callbacks waiting for getmany: (kind, partitions, done).
        self._deferred: list[tuple[str, set[TopicPartition], asyncio.Future[None]]] = []
        self._wakeup: asyncio.Future[None] | None = None
        self._closed = False
        # Records straight from the fetches (draining.py); None: aiokafka's getmany.
        self._drainer: Drainer | None = None
        # The group generation and member id of the last assignment (exactly-once: its
        # offsets go into transactions with them), or None before the first.
        self.generation: tuple[int, str] | None = None

    @property
    def client(self) -> Any:
        """The ``AIOKafkaConsumer`` behind this consumer (None until it is started)."""
        return self._kafka

    async def start(self) -> None:
        """Connect, retrying until ``connect_timeout``; a group member joins in ``getmany``."""
        if self._kafka is None:
            if self._closed:
                raise TransportError("this Kafka consumer is closed")
            kafka = aiokafka.AIOKafkaConsumer(**self._options)
            await self._transport.connect(kafka.start, kafka.stop)
            if self.group_id is not None:
                # Committed offsets not taken for none while they load; under
                # exactly-once, not taken while a transaction may still commit others.
                guard(kafka, stable=self._options.get("isolation_level") == "read_committed")
            self._kafka = kafka
            self._drainer = Drainer(kafka) if usable(kafka, self._options) else None
            replay, self._replay = self._replay, []
            for call in replay:
                call()

    async def _started(self) -> Any:
        await self.start()
        return self._kafka

    def _later(self, call: Callable[[], None]) -> bool:
        if self._kafka is None:
            self._replay.append(call)
        return self._kafka is None

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the consumer group for ``topics``; the group assigns partitions."""
        if self.group_id is None:
            raise ConfigurationError("subscribe() needs a group_id; use assign() without one")
        self._listener, self._owned = listener, set()
        if not self._later(lambda: self.subscribe(topics, listener)):
            with map_kafka_errors():
                self._kafka.subscribe(topics=list(topics), listener=_Bridge(self))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions; those kept from the last call keep their position."""
        if self._listener is not None:
            raise ConfigurationError("assign() on a consumer that subscribed to a group")
        self._owned = wanted = {TopicPartition(tp[0], tp[1]) for tp in partitions}
        if self._later(lambda: self.assign(wanted)):
            return
        # aiokafka restarts every partition of a new assignment; Kafka's keeps the old ones.
        states = [(tp, self._state(tp)) for tp in wanted]
        kept = [
            (_KTP(*tp), s.position if (k := self._kept(tp)) is None else k)
            for tp, s in states
            if s is not None and s.has_valid_position
        ]
        if self._drainer is not None:
            self._drainer.forget()  # fetched again from the positions kept
        with map_kafka_errors():
            self._kafka.assign([_KTP(*tp) for tp in wanted])
            for tp, position in kept:
                self._kafka.seek(tp, position)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now (as last told to the listener)."""
        return set(self._owned)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` on (reset as ``auto_offset_reset`` says if outside
        the log)."""
        if self._later(lambda: self.seek(tp, offset)):
            return
        if self._drainer is not None:
            self._drainer.forget([tp])  # what was kept is read again from the new position
        with map_kafka_errors():
            self._kafka.seek(_KTP(tp.topic, tp.partition), offset)

    def _state(self, tp: TopicPartition) -> Any:
        # aiokafka's state of tp in the current assignment: position and highwater.
        subscription = self._kafka._subscription.subscription if self._kafka else None  # noqa: SLF001 (aiokafka's)
        assignment = subscription.assignment if subscription is not None else None
        return assignment.state_value(tp) if assignment is not None else None

    async def hand_over(self, kind: str, partitions: Any) -> None:
        """Called by the rebalance listener (aiokafka's task): queue the callback of
        ``kind`` for ``getmany`` to run, and wait until it has."""
        if not self._closed:
            done = asyncio.get_running_loop().create_future()
            self._deferred.append((kind, {TopicPartition(*tp) for tp in partitions}, done))
            if self._wakeup is not None and not self._wakeup.done():
                self._wakeup.set_result(None)
            await done

    async def _run_deferred(self) -> None:
        while self._deferred:
            kind, partitions, done = self._deferred.pop(0)
            try:
                if kind == "revoked":
                    self._owned -= partitions
                    try:
                        if self._listener is not None:
                            await self._listener.on_partitions_revoked(partitions)
                    finally:
                        # After the listener: its commit counts what is kept as not read.
                        if self._drainer is not None:
                            self._drainer.forget(partitions)
                else:
                    self._owned = set(partitions)
                    if self._listener is not None:
                        await self._listener.on_partitions_assigned(partitions)
            finally:
                if not done.done():
                    done.set_result(None)

    async def getmany(
        self, timeout: float, max_records: int
    ) -> dict[TopicPartition, list[Message]]:
        """Up to ``max_records`` records; runs due rebalance callbacks first."""
        kafka = self._kafka or await self._started()
        subscription = kafka._subscription  # noqa: SLF001 (aiokafka's)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._deferred:
                await self._run_deferred()
            if self._closed:  # by another task meanwhile
                return {}
            if not subscription.reassignment_in_progress:
                # Fast path: records the background fetcher already has; nothing waits.
                drained = None
                if self._drainer is not None:
                    drained = self._drain(kafka, max_records)
                    if drained:
                        if self._drainer.refetch and not await self._send_next(kafka):
                            return {}
                        return drained
                if drained is None:
                    try:
                        raw = await kafka.getmany(timeout_ms=0, max_records=max_records)
                    except KAFKA_ERRORS as exc:
                        raise translate(exc) from exc
                    if raw:
                        return _convert(raw)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
            if self._drainer is not None and not subscription.reassignment_in_progress:
                await self._wait_fetch(kafka, remaining)
                continue  # and drain what came
            raw = await self._wait(kafka, remaining, max_records)
            if raw:
                # Records of newly assigned partitions only after on_partitions_assigned.
                if self._deferred and self._deferred[0][0] == "assigned":
                    await self._run_deferred()
                return _convert(raw)

    async def _send_next(self, kafka: Any) -> bool:
        # The next fetch on its way before the records of the last are handed out (the
        # agents process them in one step of the loop); False if closed meanwhile.
        await send_next(kafka)
        return not self._closed

    def _drain(self, kafka: Any, max_records: int) -> dict[TopicPartition, list[Message]] | None:
        # What aiokafka's getmany does around its fetcher, then draining.py: a group
        # member raises its coordinator's errors, counts as reading (max_poll_interval_ms)
        # and is handed records only of partitions on_partitions_assigned was told of.
        try:
            if self.group_id is None:
                return self._drainer.take(max_records) if self._drainer else None
            kafka._coordinator.check_errors()  # noqa: SLF001 (aiokafka's)
            with kafka._subscription.fetch_context():  # noqa: SLF001 (aiokafka's)
                return self._drainer.take(max_records, self._owned) if self._drainer else None
        except KAFKA_ERRORS as exc:
            raise translate(exc) from exc

    async def _wait(self, kafka: Any, limit: float, max_records: int) -> Any:
        # aiokafka's getmany may block on a rebalance that waits for our listener, which
        # only getmany runs: wait for records, a deferred callback or the deadline.
        loop = asyncio.get_running_loop()
        fetch = loop.create_task(
            kafka.getmany(timeout_ms=int(limit * 1000), max_records=max_records)
        )
        self._wakeup = wakeup = loop.create_future()
        try:
            await asyncio.wait((fetch, wakeup), timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._wakeup = None
            if not fetch.done():
                # Safe: aiokafka hands records over only in the step that returns them.
                fetch.cancel()
                try:
                    await fetch
                except asyncio.CancelledError:
                    pass
        if fetch.cancelled():
            return None
        if (exc := fetch.exception()) is not None:
            raise (translate(exc) if isinstance(exc, KAFKA_ERRORS) else exc) from exc
        return fetch.result()

    async def _wait_fetch(self, kafka: Any, limit: float) -> None:
        # Wait for the fetcher's next answer (what aiokafka's getmany waits for inside),
        # a rebalance callback, an aclose from another task, or the deadline; counted as
        # reading, as aiokafka's getmany counts its wait.
        loop = asyncio.get_running_loop()
        fetched = kafka._fetcher._create_fetch_waiter()  # noqa: SLF001 (aiokafka's)
        self._wakeup = wakeup = loop.create_future()
        try:
            with kafka._subscription.fetch_context():  # noqa: SLF001 (aiokafka's)
                await asyncio.wait(
                    (fetched, wakeup), timeout=limit, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            self._wakeup = None
            if not fetched.done():
                fetched.cancel()
        if fetched.done() and not fetched.cancelled() and (exc := fetched.exception()):
            raise (translate(exc) if isinstance(exc, KAFKA_ERRORS) else exc) from exc

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``getmany`` returns for ``tp``.

        Read from aiokafka's partition state, which its fetcher advances as records are
        handed out (aiokafka's own ``position()`` is a coroutine). Right
        after an assignment it is unknown until the background fetcher has looked up the
        committed offset or applied the reset policy: ``TransportError`` then.
        """
        state = self._state(tp)
        if state is None:
            raise TransportError(f"{tp.topic}[{tp.partition}] is not assigned to this consumer")
        if not state.has_valid_position:
            raise TransportError(f"the position of {tp.topic}[{tp.partition}] is not known yet")
        kept = self._kept(tp)
        return int(state.position) if kept is None else kept

    def _kept(self, tp: TopicPartition) -> int | None:
        # Records drained from a fetch but not handed out yet start here (aiokafka's
        # position is already past them).
        return None if self._drainer is None else self._drainer.position(tp)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The log end offset of ``tp`` from the last fetch response, or None."""
        state = self._state(tp)
        return None if state is None else state.highwater

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit, for each partition, the offset of the next record to read."""
        if self.group_id is None or self._closed:
            why = "is closed" if self._closed else "has no group_id"
            raise CommitFailed(f"cannot commit: this consumer {why}")
        kafka = self._kafka or await self._started()
        if offsets:
            with map_kafka_errors(commit=True):
                await kafka.commit({_KTP(tp[0], tp[1]): off for tp, off in offsets.items()})

    async def check_generation(self) -> None:
        """Raise ``CommitFailed`` if the group no longer counts this member in its current
        generation (it was paused past its session timeout and its partitions went to
        another member). A heartbeat with the member's generation asks the coordinator.

        On aiokafka releases other than those ``generations`` was checked against, the
        offsets go to the transaction through aiokafka's ``send_offsets_to_transaction``,
        which sends no group generation (its TxnOffsetCommit is version 0): this check,
        made after the offsets are in the transaction and just before it is committed,
        stands in for the broker's check of the generation there.
        """
        kafka = self._kafka or await self._started()
        coordinator = kafka._coordinator  # noqa: SLF001 (aiokafka's)
        request = HeartbeatRequest(
            coordinator.group_id, coordinator.generation, coordinator.member_id
        )
        with map_kafka_errors():
            response = await coordinator._send_req(request)  # noqa: SLF001 (aiokafka's)
        error = kerr.for_code(response.error_code)
        if error in (kerr.IllegalGenerationError, kerr.UnknownMemberIdError):
            raise CommitFailed(f"this worker is no longer in its group ({error.__name__})")
        if error is not kerr.NoError and error is not kerr.RebalanceInProgressError:
            raise TransportError(f"the group coordinator refused a heartbeat ({error.__name__})")

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for ``tp``, or None.

        Not in the ``Consumer`` protocol (the runtime never asks): tests use it to watch a
        worker's group progress on a real broker.
        """
        if self.group_id is None:
            raise ConfigurationError("committed() needs a consumer with a group_id")
        kafka = self._kafka or await self._started()
        with map_kafka_errors():
            offset = await kafka.committed(_KTP(tp[0], tp[1]))
        return None if offset is None else int(offset)

    async def aclose(self) -> None:
        """Leave the group and disconnect; rebalance callbacks still due are dropped."""
        if self._closed:
            return
        self._closed = True
        self._transport.forget(self)
        for _, _, done in self._deferred:
            if not done.done():
                done.set_result(None)  # aiokafka's stop() waits for its coordinator task
        self._deferred.clear()
        if self._drainer is not None:
            self._drainer.forget()
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)  # a getmany waiting in another task returns {}
        kafka, self._kafka = self._kafka, None
        if kafka is not None:
            await self._transport.disconnect(kafka)


def _convert(raw: Mapping[Any, Any]) -> dict[TopicPartition, list[Message]]:
    # The hot path: one Message per ConsumerRecord, positional arguments, nothing else.
    out: dict[TopicPartition, list[Message]] = {}
    for (topic, partition), records in raw.items():
        out[TopicPartition(topic, partition)] = [
            Message(topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in records
        ]
    return out
