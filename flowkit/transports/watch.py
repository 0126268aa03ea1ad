"""Riding through a lost Kafka broker: notice, wait, say so once, and give up in time.

aiokafka and librdkafka reconnect by themselves when a broker comes back, but while it is
away they log an error per attempt, several per second per client, and a worker that waits
for ever is a zombie. ``BrokerWatch`` turns that into what an operator needs:

* one warning when the broker goes away (the clients' connection errors are the hint; they
  are not repeated to the user: this module's filter drops them while a watch runs);
* a "still waiting (N s)" line every ``REPORT_EVERY`` seconds;
* one info line when the broker accepts connections again;
* ``BrokerUnavailable`` once it has been away for ``broker_timeout`` seconds, which stops
  the worker with one line (it commits nothing it has not seen acknowledged).

Whether the broker is back is decided by a TCP connect to the bootstrap servers, made only
while it is away: a healthy broker sees no probes.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Sequence

import structlog

from ..errors import BrokerUnavailable

__all__ = ["BrokerWatch"]

log = structlog.get_logger(__name__)

PROBE_EVERY = 0.5  # seconds between TCP probes while the broker is away
REPORT_EVERY = 10.0  # seconds between "still waiting" lines

# The clients' per-attempt lines about a broker they cannot reach (their loggers and
# phrases): aiokafka's, and librdkafka's as the rdkafka transport logs them.
_LOGGERS = (
    "flowkit.transports.rdkafka.librdkafka",
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "aiokafka.admin.client",
)
_PHRASES = (
    "Unable connect to node",
    "Unable to update metadata",
    "Connect call failed",
    "KafkaConnectionError",
    "NodeNotReadyError",
    "Marking the coordinator dead",
    "marking coordinator dead",
    "Heartbeat session expired",
    "Heartbeat failed for group",  # Apache Kafka's coordinator, just restarted
    "LeaveGroup request failed",  # closing while the coordinator is away
    # librdkafka's, with the connection's name in front ("127.0.0.1:9092/1: ..."):
    "failed: Connection refused",
    "Send failed:",
    "Receive failed:",
    "Disconnected",
    "brokers are down",
    "Consumer group session timed out",
    "Coordinator Request failed",
    "Heartbeat send request failed",
    "Failed fetch messages",
    "Got error produce response",
    "RequestTimedOutError",
    "Connection at ",
    # A commit the group refused after an outage: flowkit logs its own line for it.
    "OffsetCommit failed for group",
)

_WATCHES: weakref.WeakSet[BrokerWatch] = weakref.WeakSet()


class _ConnectionErrors(logging.Filter):
    """Drops aiokafka's lines about an unreachable broker while a watch runs, and tells
    the watches (each then checks its own servers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not _WATCHES:
            return True
        message = record.getMessage()
        if not any(phrase in message for phrase in _PHRASES):
            return True
        for watch in list(_WATCHES):
            watch.hint()
        return False


_FILTER = _ConnectionErrors()


def _install_filter() -> None:
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


class BrokerWatch:
    """Watches the brokers of one transport; ``run()`` raises ``BrokerUnavailable`` when
    they have been unreachable for ``timeout`` seconds."""

    def __init__(
        self,
        servers: Sequence[str],
        timeout: float,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.servers = list(servers)
        self.timeout = timeout
        self._clock = clock
        self.away_since: float | None = None
        self._suspect = asyncio.Event()
        self.outages = 0

    def _now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    @property
    def away(self) -> bool:
        """True while the broker is known to be unreachable."""
        return self.away_since is not None

    def hint(self) -> None:
        """A client could not reach a broker: check, in ``run()``."""
        self._suspect.set()

    async def run(self) -> None:
        """Watch until cancelled; raises ``BrokerUnavailable`` after ``timeout`` s away."""
        _install_filter()
        _WATCHES.add(self)  # until close(): clients keep retrying while they shut down
        while True:
            await self._suspect.wait()
            self._suspect.clear()
            if not await self._reachable():
                await self._wait_for_broker()

    def close(self) -> None:
        """The transport is closed: let aiokafka's connection errors through again, unless
        the broker is still away (clients abandoned while it is keep retrying a while)."""
        if not self.away:
            _WATCHES.discard(self)

    async def _wait_for_broker(self) -> None:
        started = self.away_since = self._now()
        self.outages += 1
        log.warning(
            "Kafka broker unreachable; waiting for it",
            servers=self.servers,
            broker_timeout=self.timeout,
        )
        reported = started
        while True:
            await asyncio.sleep(PROBE_EVERY)
            now = self._now()
            if await self._reachable():
                self.away_since = None
                log.info(
                    "Kafka broker is back", servers=self.servers, after=round(now - started, 1)
                )
                return
            waited = now - started
            if waited >= self.timeout:
                raise BrokerUnavailable(
                    f"Kafka broker {','.join(self.servers)} unreachable for {waited:.0f} s; "
                    f"gave up (broker_timeout={self.timeout:g} s)"
                )
            if now - reported >= REPORT_EVERY:
                reported = now
                log.warning("still waiting for the Kafka broker", waited=f"{waited:.0f} s")

    async def _reachable(self) -> bool:
        for server in self.servers:
            host, _, port = server.rpartition(":")
            try:
                async with asyncio.timeout(2.0):
                    _, writer = await asyncio.open_connection(host, int(port))
            except (OSError, TimeoutError):
                continue
            writer.close()
            return True
        return False
