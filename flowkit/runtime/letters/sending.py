"""Sending dead letters, so that one always fits and a refused one never stops the worker.

A dead letter is published like an output (batched, acknowledged before the commit), but
built late: where a record fails, only its error is described (type, message and short
traceback, formatted once per kind of failure) and noted, and its headers are made when
the publisher next sends, for all the records noted since, in one pass. Made whole one at
a time between good records, a dead letter cost several good records' time on Kafka, more
than its instructions: its code ran cold every time (see "Router on Kafka" in
docs/benchmarks.md). The error itself is not kept: its frames would live on in reference
cycles until a full garbage collection. The
publisher counts a noted letter as buffered, so nothing commits before it is sent and
acknowledged. If
the record and its headers are over the producer's limit, its value is cut to fit
(``fit_dead_letter``). If the broker refuses it anyway (a limit of its own), it is sent
again without its value. If even that is refused, the record is logged with its
coordinates, counted in ``flowkit_dead_letters_lost``, and skipped: a record that cannot
be dead-lettered must not stop every restart of the worker on the same offset.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from ...clock import Clock
from ...deadletter import (
    describe_failure,
    failure_headers,
    fit_dead_letter,
    ordered_failure_headers,
    shared_failure_headers,
    short_traceback,
)
from ...errors import ProcessingError, RecordRejected
from ...locations import user_location
from ...metrics import Metrics
from ...records import Headers, Message, record_size
from ..observe.logbudget import LogBudget

if TYPE_CHECKING:  # the publisher is handed in: a sibling, not imported
    from ..output.lanes import Lane
    from ..output.publisher import Publisher

__all__ = ["RECENT_LETTERS", "Letter", "LetterSender", "RecentLetter", "log_failure", "stage_of"]

# The dead letters a worker keeps in memory for its live page, at most.
RECENT_LETTERS = 20

# One of them: ``(described, stage, agent, source topic, partition, offset, failed_at_ms,
# dead-letter topic)``, ``described`` as ``describe_failure`` made it (bounded): no record
# value is kept.
RecentLetter = tuple[tuple[bytes, bytes, bytes], str, str | None, str, int, int, int, str]

log = structlog.get_logger("flowkit.runtime.flow.dispatch")  # the failure lines' usual source


class Letter(tuple[Message, tuple[bytes, bytes, bytes], str, str | None, int, str, int]):
    """A failed record noted for the dead-letter ``topic``, and the origin of its send:
    ``(message, described, stage, agent, attempts, topic, failed_at_ms)``, where
    ``described`` is ``describe_failure``'s. A tuple, made by C: one per failed record, so
    it is the note itself, and its headers are made from it (``headers``) only where they
    are sent, not kept on it."""

    __slots__ = ()
    valueless = False  # sent again without the value, after the broker refused it

    @property
    def message(self) -> Message:
        return self[0]

    @property
    def stage(self) -> str:
        return self[2]

    @property
    def topic(self) -> str:
        return self[5]

    @property
    def headers(self) -> Headers:
        """The dead letter's headers, before any truncation marks: ``failure_headers``'s
        (``LetterSender.build`` makes the same, in a batch)."""
        message, described, stage, agent, attempts, _, failed_at_ms = self
        return failure_headers(
            message,
            described,
            stage=stage,
            agent=agent,
            attempts=attempts,
            failed_at_ms=failed_at_ms,
        )


class _Valueless(Letter):
    """A letter sent again without its value."""

    __slots__ = ()
    valueless = True


# The names of the three headers made per letter (their size, counted once).
_NAMES = len("flowkit.source.offset") + len("flowkit.source.timestamp") + len("flowkit.failed_at")


class _Group:
    """The letters of one build that share their failure, source partition, agent,
    attempts and topic: their eight shared headers, those headers' size, their lane."""

    __slots__ = ("headers", "lane", "letters", "size")

    def __init__(self, headers: tuple[tuple[str, bytes], ...], size: int, lane: Lane) -> None:
        self.headers = headers
        self.size = size
        self.lane = lane
        self.letters = 0


class LetterSender:
    """Builds and publishes the dead letters of one worker through its ``publisher``."""

    def __init__(
        self,
        *,
        publisher: Publisher,
        default_topic: str,
        clock: Clock,
        metrics: Metrics,
        counter: Callable[..., Any],
        log_budget: LogBudget,
        fail_fast: bool,
    ) -> None:
        self._publisher = publisher
        self._publish = publisher.publish
        self._place = publisher.place
        self._placed = publisher.placed
        self._relieve = publisher.relieve
        # Failed records noted and not built yet; ``build`` empties it before each flush.
        self._noted: list[Letter] = []
        self.max_record_bytes = publisher.max_record_bytes
        self.default_topic = default_topic
        self.clock = clock
        self.metrics = metrics
        self._counter = counter
        self.log_budget = log_budget
        self.fail_fast = fail_fast
        # The latest letters built and how many per agent, for the live page: filled once
        # per batch of letters (``build``), bounded.
        self.recent: deque[RecentLetter] = deque(maxlen=RECENT_LETTERS)
        self.by_agent: dict[str | None, int] = {}

    async def send(
        self,
        message: Message,
        error: BaseException,
        *,
        stage: str,
        agent: str | None,
        attempts: int = 1,
        topic: str | None = None,
    ) -> None:
        """Send ``message`` to the dead-letter ``topic``, with headers saying why: noted
        now, built and placed in its lane by the publisher's next flush (``build``)."""
        if self.note(message, error, stage=stage, agent=agent, attempts=attempts, topic=topic):
            await self._relieve()

    def note(
        self,
        message: Message,
        error: BaseException,
        *,
        stage: str,
        agent: str | None,
        attempts: int = 1,
        topic: str | None = None,
    ) -> bool:
        """``send`` without its wait: True when the publisher is full, and the caller is
        to await its ``relieve`` before going on."""
        # A decode failure is logged once, as "record failed" by the agent that dead-letters
        # it (the first declared reader of its topic), not again here.
        if stage == "decode" and self.fail_fast:
            raise error
        self._noted.append(
            Letter(
                (
                    message,
                    # Described now (a walk of its frames; formatted once per kind of
                    # failure): the error is not kept, so its frames and their cycles die
                    # with it.
                    describe_failure(error),
                    stage,
                    agent,
                    attempts,
                    topic or self.default_topic,
                    int(self.clock.time() * 1000),
                )
            )
        )
        return self._placed(1)  # counted as buffered: no commit before it is acknowledged

    def build(self) -> None:
        """Make the noted dead letters and place them in their lanes (the publisher calls
        this at the start of each flush, under its lock: they leave in that flush)."""
        noted, self._noted = self._noted, []
        if not noted:
            return
        limit = self.max_record_bytes
        # The headers of ``failure_headers``, in its order, made here for the whole batch:
        # the letters of a burst share all but their offset, timestamp and time of failure,
        # so ``shared_failure_headers`` is encoded once per group (failure, source
        # partition, agent, attempts, topic), with its size and its topic's lane, and only
        # those three per letter. Each letter is then put in its lane's partition: its
        # size is known here, so the publisher's ``place`` (which counts every header
        # again) is only for a letter over ``limit`` (cut by ``fit_dead_letter``) or a
        # lane whose partition count is not known yet.
        groups: dict[tuple[Any, ...], _Group] = {}
        failed_ms, failed = -1, ("flowkit.failed_at", b"")
        for letter in noted:
            message, described, stage, agent, attempts, topic, failed_at_ms = letter
            # The noted list holds ``described`` until the end: its id is not reused here.
            where = (id(described), stage, message.topic, message.partition, agent, attempts, topic)
            group = groups.get(where)
            if group is None:
                group = groups[where] = self._group(letter)
            group.letters += 1
            if failed_at_ms != failed_ms:
                failed_ms, failed = failed_at_ms, ("flowkit.failed_at", str(failed_at_ms).encode())
            offset = str(message.offset).encode()
            timestamp = str(message.timestamp).encode()
            original = message.headers
            headers = ordered_failure_headers(
                original,
                group.headers,
                ("flowkit.source.offset", offset),
                ("flowkit.source.timestamp", timestamp),
                failed,
            )
            key, value = message.key, message.value
            lane = group.lane
            parts = lane.parts  # None until the lane knows its partition count
            if limit is not None and value is not None:
                # record_size of the letter: the record's, and the headers added to it
                # (the group's shared ones sized once).
                size = group.size + _NAMES + len(offset) + len(timestamp) + len(failed[1])
                size += record_size(key, value, original)
                if size > limit:  # cut, and marked, to fit
                    value, headers = fit_dead_letter(key, value, headers, limit)
                    parts = None  # the publisher's place checks it again
            if parts is not None:
                # ``Lane.put`` written out: a call less a letter, and no key hashed for
                # a dead-letter topic's usual single partition.
                records, origins = parts[0] if len(parts) == 1 else parts[lane.partition(key)]
                records.append((key, value, headers, message.timestamp))
                origins.append(letter)
                continue
            try:
                self._place(topic, value, key, headers, letter, message.timestamp)
            except RecordRejected as exc:
                self._log_lost(letter, exc)
        stages: dict[str, int] = {}  # the metric moved once per stage and batch
        by_agent = self.by_agent
        for (_, stage, _, _, agent, *_), group in groups.items():
            stages[stage] = stages.get(stage, 0) + group.letters
            by_agent[agent] = by_agent.get(agent, 0) + group.letters
        recent = self.recent
        for letter in noted[-RECENT_LETTERS:]:  # the latest, for the live page: no value kept
            m, told, at_stage, by, _, dlq, failed_ms = letter
            recent.append((told, at_stage, by, m.topic, m.partition, m.offset, failed_ms, dlq))
        for stage, count in stages.items():
            self._counter(self.metrics.dead_letters, stage).inc(count)

    def _group(self, letter: Letter) -> _Group:
        message, described, stage, agent, attempts, topic, _ = letter
        headers = shared_failure_headers(
            message, described, stage=stage, agent=agent, attempts=attempts
        )
        return _Group(headers, record_size(None, None, headers), self._publisher.lane(topic))

    async def refused(self, letter: Letter, exc: RecordRejected) -> None:
        """The broker refused ``letter`` for good: send it again without its value, or,
        if that was refused too, log and count it."""
        message = letter.message
        if letter.valueless or message.value is None:
            await self._lost(letter, exc)
            return
        # No value at all: the broker's own limit may be below the producer's, which
        # ``build`` already cut the letter to.
        valueless = _Valueless(letter)
        value, headers = fit_dead_letter(message.key, message.value, letter.headers, 0)
        try:
            full = self._publish(
                letter.topic, value, message.key, headers, valueless, message.timestamp
            )
        except RecordRejected as again:
            await self._lost(valueless, again)
            return
        if full:
            await self._relieve()

    async def _lost(self, letter: Letter, exc: RecordRejected) -> None:
        self._log_lost(letter, exc)
        if self.fail_fast:
            raise exc

    def _log_lost(self, letter: Letter, exc: RecordRejected) -> None:
        message = letter.message
        self._counter(self.metrics.dead_letters_lost, letter.stage).inc()
        log.error(
            "dead letter refused by the broker; the record is skipped",
            dlq=letter.topic,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            error=str(exc),
        )


def stage_of(exc: BaseException) -> str:
    """The stage that a failure names in its log line and dead letter."""
    return exc.stage if isinstance(exc, ProcessingError) else "process"


# The failures whose traceback was logged, by agent, error type and place: each once.
_traced: set[tuple[str, type, str | None]] = set()
_TRACED_MAX = 1000  # distinct failures remembered, at most (then each is traced again)


def log_failure(
    agent: str, stage: str, action: Any, message: Message, attempts: int, exc: BaseException
) -> str | None:
    """The error line of a failed record (the dispatcher's, within its log budget): where
    in the user's code it failed (``at``), and the first time this agent fails so there,
    the traceback. Returns that place (None if the error is not in the user's code)."""
    at = user_location(exc)
    seen = (agent, exc.__class__, at)
    fields: dict[str, Any] = {}
    if at is not None and seen not in _traced:  # (a bad record's decode error: no code)
        if len(_traced) >= _TRACED_MAX:
            _traced.clear()
        _traced.add(seen)
        fields["exception"] = short_traceback(exc)  # (rendered below the line, or a field)
    log.error(
        "record failed",
        agent=agent,
        stage=stage,
        action=action,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        attempts=attempts,
        error=repr(exc),
        **({"at": at} if at is not None else {}),
        **fields,
    )
    return at
