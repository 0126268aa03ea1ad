"""Dead letters: the record that failed, unchanged, plus headers that say why.

The worker builds a dead letter with ``dead_letter_headers`` and sends it to the app's
dead-letter topic (``<app>-dlq``) with the original key, value and headers. The offset of
the failed record is committed only after that send is acknowledged.

A dead letter always fits: if the record plus these headers is over what the producer
sends, ``fit_dead_letter`` cuts the value and says so in ``flowkit.value.truncated``,
``flowkit.value.size`` and ``flowkit.value.sha256``; the source topic, partition and
offset say where the whole record can be read while the topic's retention keeps it.

flowkit's own headers are always the last of a dead letter, in a fixed order
(``FAILURE_HEADERS``, then ``TRUNCATION_HEADERS`` if the value was cut): a reader tells
them apart from the record's own by that position, not by their ``flowkit.`` prefix, so a
record's own header named ``flowkit.value.truncated`` (or any ``flowkit.*``) stays one of
its own headers and says nothing about the letter.
"""

from __future__ import annotations

import hashlib
import linecache
from collections.abc import Iterator
from types import CodeType, TracebackType
from typing import Any

from ._printable import printable
from .records import Headers, Message, record_size

__all__ = [
    "FAILURE_HEADERS",
    "DeadLetter",
    "HEADER_PREFIX",
    "TRUNCATION_HEADERS",
    "MAX_TRACEBACK",
    "TRACEBACK_FRAMES",
    "dead_letter_headers",
    "dead_letter_topic",
    "describe_failure",
    "failure_headers",
    "fit_dead_letter",
    "ordered_failure_headers",
    "shared_failure_headers",
    "short_traceback",
]

HEADER_PREFIX = "flowkit."
MAX_TRACEBACK = 4000  # bytes of traceback kept: enough to find the line, bounded per record
TRACEBACK_FRAMES = 6  # innermost frames kept per exception: where it was raised

# The names of flowkit's own headers, last in every dead letter and in this order (see
# ``ordered_failure_headers``), then those of ``fit_dead_letter`` if it cut the value.
FAILURE_HEADERS = (
    "flowkit.error.type",
    "flowkit.error.message",
    "flowkit.error.stage",
    "flowkit.error.traceback",
    "flowkit.source.topic",
    "flowkit.source.partition",
    "flowkit.source.offset",
    "flowkit.source.timestamp",
    "flowkit.agent",
    "flowkit.attempts",
    "flowkit.failed_at",
)
TRUNCATION_HEADERS = ("flowkit.value.truncated", "flowkit.value.size", "flowkit.value.sha256")


def dead_letter_topic(app_name: str) -> str:
    """The app's default dead-letter topic name.

    >>> dead_letter_topic("shop")
    'shop-dlq'
    """
    return f"{app_name}-dlq"


def dead_letter_headers(
    message: Message,
    error: BaseException,
    *,
    stage: str,
    agent: str | None,
    attempts: int,
    failed_at_ms: int,
) -> Headers:
    """The original headers followed by ``flowkit.*`` headers describing the failure."""
    return failure_headers(
        message,
        describe_failure(error),
        stage=stage,
        agent=agent,
        attempts=attempts,
        failed_at_ms=failed_at_ms,
    )


def shared_failure_headers(
    message: Message,
    described: tuple[bytes, bytes, bytes],
    *,
    stage: str,
    agent: str | None,
    attempts: int,
) -> tuple[tuple[str, bytes], ...]:
    """The eight ``flowkit.*`` headers of ``failure_headers`` that do not change from one
    record to the next for the same failure, source partition, agent and attempts, in
    order: error type, message, stage, traceback, source topic and partition, agent,
    attempts. (The worker encodes them once for a burst of dead letters.)"""
    # The names are written out whole (each is HEADER_PREFIX + its suffix): one tuple,
    # no generator and no string concatenation per header.
    kind, text, trace = described
    return (
        ("flowkit.error.type", kind),
        ("flowkit.error.message", text),
        ("flowkit.error.stage", stage.encode()),
        ("flowkit.error.traceback", trace),
        ("flowkit.source.topic", message.topic.encode()),
        ("flowkit.source.partition", str(message.partition).encode()),
        ("flowkit.agent", (agent or "").encode()),
        ("flowkit.attempts", str(attempts).encode()),
    )


def failure_headers(
    message: Message,
    described: tuple[bytes, bytes, bytes],
    *,
    stage: str,
    agent: str | None,
    attempts: int,
    failed_at_ms: int,
) -> Headers:
    """``dead_letter_headers`` for an error already described by ``describe_failure``:
    the record's own headers, then ``shared_failure_headers`` with the record's offset and
    timestamp after its partition, and the time of failure last."""
    shared = shared_failure_headers(message, described, stage=stage, agent=agent, attempts=attempts)
    return ordered_failure_headers(
        message.headers,
        shared,
        ("flowkit.source.offset", str(message.offset).encode()),
        ("flowkit.source.timestamp", str(message.timestamp).encode()),
        ("flowkit.failed_at", str(failed_at_ms).encode()),
    )


def ordered_failure_headers(
    original: Headers,
    shared: tuple[tuple[str, bytes], ...],
    offset: tuple[str, bytes],
    timestamp: tuple[str, bytes],
    failed_at: tuple[str, bytes],
) -> Headers:
    """A dead letter's headers in their order: the record's own, then the eight of
    ``shared_failure_headers`` with the record's offset and timestamp after its partition,
    and the time of failure last. (The worker's batch build passes the shared ones encoded
    once for a burst.)"""
    kind, text, stage_h, trace, topic_h, partition, agent_h, attempts_h = shared
    ordered = (
        kind,
        text,
        stage_h,
        trace,
        topic_h,
        partition,
        offset,
        timestamp,
        agent_h,
        attempts_h,
        failed_at,
    )
    return (*original, *ordered) if original else ordered


def short_traceback(error: BaseException) -> str:
    """The innermost ``TRACEBACK_FRAMES`` frames of ``error`` and of its causes, in
    Python's layout, without the column markers.

    ``traceback.format_exception`` parses each frame's source line to place its ``^^^``
    markers: that, over the whole stack, was most of what a dead letter cost.

    >>> try:
    ...     int("x")
    ... except ValueError as exc:
    ...     print(short_traceback(exc).splitlines()[-1])
    ValueError: invalid literal for int() with base 10: 'x'
    """
    parts: list[str] = []
    for current, frames, separator in _chain(error):
        lines = ["Traceback (most recent call last):\n"]
        for tb in frames[-TRACEBACK_FRAMES:]:
            code = tb.tb_frame.f_code
            # Keyed by the code and the instruction, not the line: ``tb_lineno`` decodes
            # the code's line table on every read, which was most of what a frame cost.
            entry = _frames.get((id(code), tb.tb_lasti))
            if entry is None or entry[0] is not code:
                entry = _frame_entry(code, tb)
            lines.append(entry[1])
        text = str(current)
        name = type(current).__name__
        lines.append(f"{name}: {text}\n" if text else f"{name}\n")
        parts.append("".join(lines))
        if separator:
            parts.append(separator)
    if parts[-1] in (_CAUSE, _CONTEXT):
        parts.pop()  # a chain cut by a cycle: no dangling separator
    return "".join(reversed(parts))


# (id(code), instruction) -> the code (which keeps the id from being reused) and its lines
_frames: dict[tuple[int, int], tuple[CodeType, str]] = {}

# What a failure looks like, by where it happened and what it says (each exception of the
# chain: its type, its text and its frames' codes and instructions) -> the codes (which
# keep their ids from being reused) and the three headers' values, encoded.
_described_as: dict[tuple[Any, ...], tuple[list[CodeType], tuple[bytes, bytes, bytes]]] = {}


def describe_failure(error: BaseException) -> tuple[bytes, bytes, bytes]:
    """The error's type name, message and short traceback, encoded and bounded.

    A burst of bad records fails in a few places with a few messages: each such failure is
    formatted once; the next ones cost a walk of their frames and one lookup.
    """
    text = str(error)
    # The key: each exception of the chain as Python follows it (its type, its text, the
    # code and instruction of every frame, then how the next one is linked), in one loop
    # with no generator and no list of frames. Every frame, not only the innermost ones
    # the traceback shows: a longer key is as exact, and a slice would cost a list.
    key: list[Any] = [text]
    current: BaseException | None = error
    links = 0
    while current is not None:
        key.append(current.__class__)
        if links:
            key.append(str(current))
        tb = current.__traceback__
        while tb is not None:
            key.append(id(tb.tb_frame.f_code))
            key.append(tb.tb_lasti)
            tb = tb.tb_next
        links += 1
        if links > _MAX_LINKS:  # a cycle (short_traceback ends it where it closes)
            break
        if current.__cause__ is not None:
            key.append(_CAUSE)
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            key.append(_CONTEXT)
            current = current.__context__
        else:
            current = None
    signature = tuple(key)
    entry = _described_as.get(signature)
    if entry is None:
        described = (
            type(error).__name__.encode(),
            text.encode()[:MAX_TRACEBACK],
            short_traceback(error).encode()[-MAX_TRACEBACK:],
        )
        if len(_described_as) >= 10_000:
            _described_as.clear()
        entry = _described_as[signature] = (_codes(error), described)
    return entry[1]


_MAX_LINKS = 100  # exceptions of a chain in a key: Python's own walk stops at a cycle


def _codes(error: BaseException) -> list[CodeType]:
    # The code objects whose ids a key holds: kept with it, so no id is reused meanwhile.
    # A key may go round a cycle more than once; its ids are those of the first round.
    return [tb.tb_frame.f_code for _, frames, _ in _chain(error) for tb in frames]


def _chain(
    error: BaseException,
) -> Iterator[tuple[BaseException, list[TracebackType], str]]:
    # Each exception of the chain, newest first (as Python follows it: the cause, else the
    # context unless suppressed; a cycle ends it), with all its frames, outermost first,
    # and the separator before the next ("" at the end).
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = []
        tb = current.__traceback__
        while tb is not None:
            frames.append(tb)
            tb = tb.tb_next
        if current.__cause__ is not None:
            following, separator = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            following, separator = current.__context__, _CONTEXT
        else:
            following, separator = None, ""
        yield current, frames, separator
        current = following


def _frame_entry(code: CodeType, tb: TracebackType) -> tuple[CodeType, str]:
    # A burst of bad records fails in the same few places: each is formatted once.
    filename, lineno = code.co_filename, tb.tb_lineno
    source = linecache.getline(filename, lineno).strip()
    text = f'  File "{filename}", line {lineno}, in {code.co_name}\n'
    if source:
        text += f"    {source}\n"
    if len(_frames) >= 10_000:
        _frames.clear()
    entry = _frames[(id(code), tb.tb_lasti)] = (code, text)
    return entry


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def fit_dead_letter(
    key: bytes | None, value: bytes | None, headers: Headers, limit: int | None
) -> tuple[bytes | None, Headers]:
    """The value and headers of a dead letter of at most ``limit`` bytes (None: any size).

    If the record is larger, the value is cut to what fits (or dropped) and three headers
    say so: ``flowkit.value.truncated``, ``flowkit.value.size`` (the original's bytes) and
    ``flowkit.value.sha256`` (its digest, to check a copy fetched from the source topic).

    >>> value, headers = fit_dead_letter(b"k", b"x" * 500, (), limit=300)
    >>> len(value), dict(headers)["flowkit.value.size"]
    (167, b'500')
    """
    if value is None or limit is None:
        return value, headers
    size = record_size(key, value, headers)
    if size <= limit:
        return value, headers
    marks = (
        (HEADER_PREFIX + "value.truncated", b"true"),
        (HEADER_PREFIX + "value.size", str(len(value)).encode()),
        (HEADER_PREFIX + "value.sha256", hashlib.sha256(value).hexdigest().encode()),
    )
    keep = limit - (size - len(value)) - record_size(None, None, marks)
    return (value[:keep] if keep > 0 else None), (*headers, *marks)


class DeadLetter:
    """A dead-letter record read back: the original record and why it failed.

    >>> from flowkit.records import Message
    >>> m = Message("orders", 2, 7, 1000, b"k", b"{", (("trace", b"t"),))
    >>> headers = dead_letter_headers(m, ValueError("bad"), stage="process", agent="a",
    ...                               attempts=1, failed_at_ms=5)
    >>> letter = DeadLetter(Message("app-dlq", 0, 0, 1000, b"k", b"{", headers))
    >>> letter.source_topic, letter.source_offset, letter.error_type, letter.original_headers
    ('orders', 7, 'ValueError', (('trace', b't'),))
    """

    def __init__(self, message: Message) -> None:
        self.message = message
        headers = message.headers
        own = _own_headers(headers)
        #: True if the headers end as flowkit writes them. Else the letter was written by
        #: something else, and every ``flowkit.*`` header is read as flowkit's (so one
        #: saying the value is truncated is believed: such a letter is not replayed whole).
        self.recognised = own is not None
        if own is None:
            original = tuple(h for h in headers if not h[0].startswith(HEADER_PREFIX))
            ours = [h for h in headers if h[0].startswith(HEADER_PREFIX)]
        else:
            split = len(headers) - own
            original, ours = tuple(headers[:split]), list(headers[split:])
        # (Kafka allows a header without a value.)
        self.meta: dict[str, str] = {
            name[len(HEADER_PREFIX) :]: (value or b"").decode(errors="replace")
            for name, value in ours
        }
        self.original_headers: Headers = original

    @property
    def error_type(self) -> str:
        return self.meta.get("error.type", "?")

    @property
    def error_message(self) -> str:
        return self.meta.get("error.message", "")

    @property
    def stage(self) -> str:
        return self.meta.get("error.stage", "?")

    @property
    def traceback(self) -> str:
        """The stored traceback of the failure (its innermost frames), or ''."""
        return self.meta.get("error.traceback", "")

    @property
    def agent(self) -> str:
        return self.meta.get("agent", "")

    @property
    def source_topic(self) -> str:
        return self.meta.get("source.topic", "")

    @property
    def source_partition(self) -> int:
        return self._number("source.partition", -1)

    @property
    def source_offset(self) -> int:
        return self._number("source.offset", -1)

    @property
    def truncated(self) -> bool:
        """True if the value is cut (or dropped) to fit the producer's size limit."""
        return self.meta.get("value.truncated") == "true"

    @property
    def original_size(self) -> int:
        """The original value's size in bytes (as carried, if not truncated)."""
        return self._number("value.size", len(self.message.value or b""))

    @property
    def value_sha256(self) -> str | None:
        """The hex SHA-256 of the original value, carried when the value is truncated."""
        return self.meta.get("value.sha256")

    @property
    def source_timestamp(self) -> int:
        """The failed record's timestamp (ms), else the dead letter's own (which a worker
        sets to the same)."""
        return self._number("source.timestamp", self.message.timestamp)

    @property
    def failed_at_ms(self) -> int:
        return self._number("failed_at", 0)

    def _number(self, name: str, default: int) -> int:
        # Anyone may write to a dead-letter topic: a header that is not a number reads
        # as missing, and the letter is still shown and replayed.
        try:
            return int(self.meta[name])
        except (KeyError, ValueError):
            return default

    def matches(self, where: dict[str, str]) -> bool:
        """True if every ``field=value`` in ``where`` holds (fields: stage, error, agent,
        topic, partition)."""
        fields = {
            "stage": self.stage,
            "error": self.error_type,
            "agent": self.agent,
            "topic": self.source_topic,
            "partition": str(self.source_partition),
        }
        return all(fields.get(k) == v for k, v in where.items())

    def describe(self, width: int = 60) -> str:
        """One readable line: where it came from, when, why, and a value preview."""
        import datetime

        try:
            at = datetime.datetime.fromtimestamp(self.failed_at_ms / 1000, datetime.UTC)
            when = f"{at:%Y-%m-%d %H:%M:%S}"
        except (OverflowError, ValueError, OSError):  # a time no calendar holds
            when = "????-??-?? ??:??:??"
        value = self.message.value
        # Bytes that are not UTF-8 show escaped (\xff), and so does every character that
        # is not printable (controls, escape sequences, bidi overrides): never raw.
        preview = "<none>" if value is None else value[:width].decode(errors="backslashreplace")
        if value is not None and len(value) > width:
            preview += "…"
        if self.truncated:
            preview += f" (truncated: {len(value or b'')} of {self.original_size} bytes)"
        return printable(
            f"{self.message.offset:>6}  {when}  {self.stage:<7} "
            f"{self.source_topic}/{self.source_partition}@{self.source_offset}  "
            f"agent={self.agent or '-'}  {self.error_type}: {self.error_message[:80]}  "
            f"value={preview}"
        )


def _own_headers(headers: Headers) -> int | None:
    """How many of ``headers``, at their end, are flowkit's own (``FAILURE_HEADERS``,
    then ``TRUNCATION_HEADERS`` if the value was cut), or None if they do not end so."""
    n = len(headers)
    own = len(FAILURE_HEADERS)
    if (
        n >= own + len(TRUNCATION_HEADERS)
        and _names(headers, n - len(TRUNCATION_HEADERS), n) == TRUNCATION_HEADERS
    ):
        own += len(TRUNCATION_HEADERS)
    if n < own or _names(headers, n - own, n - own + len(FAILURE_HEADERS)) != FAILURE_HEADERS:
        return None
    return own


def _names(headers: Headers, start: int, stop: int) -> tuple[str, ...]:
    return tuple(name for name, _ in headers[start:stop])
