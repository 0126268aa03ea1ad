"""Test your app without a broker: a driver over the memory broker and a fake clock.

>>> import asyncio, flowkit
>>> from flowkit.testing import TestDriver
>>> app = flowkit.App("demo")
>>> numbers = app.topic("numbers", value_type=int)
>>> doubled = app.topic("doubled", value_type=int)
>>> @app.agent(numbers, sink=[doubled])
... async def double(stream):
...     async for n in stream:
...         yield n * 2
>>> async def main():
...     async with TestDriver(app) as driver:
...         await driver.send(numbers, 21)
...         await driver.run_until_idle()
...         return await driver.values(doubled)
>>> asyncio.run(main())
[42]
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable
from typing import Any

from .app import App
from .clock import Clock
from .durations import Seconds
from .durations import seconds as as_seconds
from .errors import TransportError
from .records import Headers, Message, TopicPartition
from .runtime import Worker
from .scope import enter_scope
from .state import TableBase
from .topics import Topic
from .transports import MemoryBroker, MemoryTransport, Transport, read_topic
from .transports.base import Ack

__all__ = ["FakeClock", "TestDriver"]


class FakeClock:
    """A clock that moves only when ``advance`` is awaited.

    Sleepers wake in deadline order, each at its own deadline, so a 1 s timer fires ten
    times in ``await clock.advance(10)``.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall = start
        self._mono = 0.0
        self._seq = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    async def advance(self, seconds: Seconds) -> None:
        """Move time forward by ``seconds`` (or a ``timedelta``), waking each sleeper at
        its deadline."""
        seconds = as_seconds(seconds, "advance(seconds=)")
        if seconds < 0:
            raise ValueError("time only moves forward")
        for _ in range(5):  # let freshly started tasks reach their first sleep
            await asyncio.sleep(0)
        target = self._mono + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline = self._sleepers[0][0]
            self._set(deadline)
            while self._sleepers and self._sleepers[0][0] <= deadline:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            for _ in range(5):  # let woken tasks run and sleep again
                await asyncio.sleep(0)
        self._set(target)

    def _set(self, mono: float) -> None:
        self._wall += mono - self._mono
        self._mono = mono


class TestDriver:
    """Runs an app's worker on a memory broker; send records, run until idle, read outputs.

    ``broker`` lets several drivers (one after another) share a broker, to test restarts.
    ``transport`` runs the same test on any other transport (flowkit's own tests pass a
    Kafka transport); ``settle`` is then how many seconds the worker must stay idle
    before ``run_until_idle`` believes it, to cover the broker's fetch latency.
    With ``fail_fast=True`` a failing record stops the worker and ``run_until_idle``
    raises its error, instead of dead-lettering it.

    Each driver runs a worker of its own, with fresh table state, even when the App is a
    module-level object shared by many tests. Inside ``async with TestDriver(app)``, the
    test reads tables as the app's agents do (``counts["k"]``, ``counts.windows("k")``):
    entering the driver makes its worker's state the test task's. ``driver.store(table)``
    names it explicitly (with two drivers at once, for example).
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        app: App,
        *,
        broker: MemoryBroker | None = None,
        transport: Transport | None = None,
        clock: Clock | None = None,
        fail_fast: bool = False,
        settle: float = 0.0,
        **worker_options: Any,
    ) -> None:
        if broker is not None and transport is not None:
            raise ValueError("give a memory broker or a transport, not both")
        self.app = app
        self.broker = broker or MemoryBroker()
        self.clock: Clock = clock or FakeClock()
        self._own_transport = transport is None
        self.transport: Transport = transport or MemoryTransport(self.broker)
        self.settle = settle
        self._produced: dict[TopicPartition, int] = {}
        self._unacked: list[Awaitable[Ack]] = []
        self.worker = Worker(
            app,
            transport=self.transport,
            clock=self.clock,
            fail_fast=fail_fast,
            **worker_options,
        )
        self._producer = self.transport.producer(client_id="flowkit-testing")

    async def __aenter__(self) -> TestDriver:
        await self._producer.start()
        await self.worker.start()
        # The test task now reads tables as this worker's tasks do. Not undone on exit:
        # the state stays readable after the worker stopped, until another driver starts.
        enter_scope(self.worker.scope)
        return self

    def store(self, table: TableBase[Any, Any]) -> Any:
        """This driver's worker's state of ``table`` (read it like the table)."""
        return self.worker.state.stores[table]

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the worker gracefully (it commits) and close the driver's producer."""
        await self.worker.aclose()
        await self._producer.aclose()
        if self._own_transport:
            await self.transport.aclose()
            # Outputs stay readable after the stop, from the same memory broker.
            self.transport = MemoryTransport(self.broker)
        if self.worker.error is not None and not isinstance(self.worker.error, Exception):
            raise self.worker.error

    # -- input ----------------------------------------------------------------------------

    async def send(
        self,
        topic: Topic[Any] | str,
        value: Any,
        *,
        key: Any = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Ack]:
        """Encode ``value`` with the topic's codec and produce it; await the result for
        the broker's ack (``run_until_idle`` awaits them all)."""
        t = self._topic(topic)
        return await self.send_raw(
            t.name,
            None if value is None else t.encode(value),
            key=t.encode_key(key),
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp_ms,
        )

    async def send_raw(
        self,
        topic: Topic[Any] | str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[Ack]:
        """Produce bytes as they are (for malformed-input tests)."""
        name = topic if isinstance(topic, str) else topic.name
        if timestamp_ms is None:
            timestamp_ms = int(self.clock.time() * 1000)
        pending = await self._producer.send(
            name, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        # Not awaited here: a broker acks batches, and waiting per record would make a
        # test of 10,000 records wait 10,000 lingers. run_until_idle awaits them.
        self._unacked.append(pending)
        return pending

    async def _await_sends(self) -> None:
        pending, self._unacked = self._unacked, []
        for awaitable in pending:
            ack = await awaitable
            tp = TopicPartition(ack.topic, ack.partition)
            self._produced[tp] = max(self._produced.get(tp, 0), ack.offset + 1)

    # -- running --------------------------------------------------------------------------

    async def run_until_idle(self, timeout: Seconds = 10.0) -> None:
        """Wait until every record sent so far is processed and its outputs are sent.

        Raises the worker's error if it stopped on one, or ``TimeoutError`` after
        ``timeout`` real seconds.
        """
        timeout = as_seconds(timeout, "run_until_idle(timeout=)")
        await self._await_sends()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet = 0
        quiet_since = loop.time()
        while quiet < 3 or loop.time() - quiet_since < self.settle:
            await asyncio.sleep(0 if quiet else 0.001)
            if self.worker.error is not None:
                raise self.worker.error
            if self.worker.is_idle() and self._caught_up():
                if quiet == 0:
                    quiet_since = loop.time()
                quiet += 1
            else:
                quiet = 0
            if loop.time() > deadline:
                raise TimeoutError(f"the worker did not become idle within {timeout} s")

    def _caught_up(self) -> bool:
        fetcher = self.worker.fetcher
        if fetcher is None:
            return True
        consumer = fetcher.consumer
        assigned = consumer.assignment()
        try:
            return all(
                consumer.position(tp) >= end for tp, end in self._produced.items() if tp in assigned
            )
        except TransportError:
            return False

    async def advance(self, seconds: Seconds) -> None:
        """Move the fake clock forward by ``seconds`` (or a ``timedelta``: timers fire,
        commits happen), then run until idle."""
        if not isinstance(self.clock, FakeClock):
            raise TypeError("advance() needs the driver's clock to be a FakeClock")
        await self.clock.advance(seconds)
        await self.run_until_idle()

    # -- output ---------------------------------------------------------------------------

    async def messages(self, topic: Topic[Any] | str) -> list[Message]:
        """Every record on ``topic``, by partition then offset."""
        name = topic if isinstance(topic, str) else topic.name
        count = await self.transport.partition_count(name)
        if not count:
            return []
        out: dict[int, list[Message]] = {p: [] for p in range(count)}
        await read_topic(
            self.transport,
            name,
            lambda tp, msgs: out[tp.partition].extend(msgs),
            client_id="flowkit-testing-reader",
        )
        return [m for p in range(count) for m in out[p]]

    async def values(self, topic: Topic[Any] | str) -> list[Any]:
        """The decoded values on ``topic``, by partition then offset."""
        t = self._topic(topic)
        return [None if m.value is None else t.decode(m.value) for m in await self.messages(t)]

    async def dead_letters(self) -> list[Message]:
        """The records in the app's dead-letter topic."""
        return await self.messages(self.worker.dlq_name)

    def _topic(self, topic: Topic[Any] | str) -> Topic[Any]:
        if isinstance(topic, Topic):
            return topic
        found = self.app.topics.get(topic)
        if found is None:
            raise KeyError(f"the app declares no topic {topic!r}")
        return found
