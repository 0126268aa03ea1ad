"""Dead letters: the record that failed, unchanged, plus headers that say why.

The worker builds a dead letter with ``dead_letter_headers`` and sends it to the app's
dead-letter topic (``<app>-dlq``) with the original key, value and headers. The offset of
the failed record is committed only after that send is acknowledged.
"""

from __future__ import annotations

import traceback

from .records import Headers, Message

__all__ = ["HEADER_PREFIX", "MAX_TRACEBACK", "dead_letter_headers", "dead_letter_topic"]

HEADER_PREFIX = "flowkit."
MAX_TRACEBACK = 4000  # bytes of traceback kept: enough to find the line, bounded per record


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
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    tb_bytes = tb.encode()[-MAX_TRACEBACK:]
    extra: list[tuple[str, bytes]] = [
        ("error.type", type(error).__name__.encode()),
        ("error.message", str(error).encode()[:MAX_TRACEBACK]),
        ("error.stage", stage.encode()),
        ("error.traceback", tb_bytes),
        ("source.topic", message.topic.encode()),
        ("source.partition", str(message.partition).encode()),
        ("source.offset", str(message.offset).encode()),
        ("source.timestamp", str(message.timestamp).encode()),
        ("agent", (agent or "").encode()),
        ("attempts", str(attempts).encode()),
        ("failed_at", str(failed_at_ms).encode()),
    ]
    return (*message.headers, *((HEADER_PREFIX + k, v) for k, v in extra))
