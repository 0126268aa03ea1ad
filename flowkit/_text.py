"""Counting nouns in messages: ``1 partition``, ``2 partitions``."""

from __future__ import annotations

__all__ = ["count"]


def count(n: float, noun: str, *, fmt: str = "") -> str:
    """``n`` and ``noun``, plural unless ``n`` shows as 1: ``count(4, "partition")``.

    >>> count(1, "partition"), count(2, "record"), count(1234.4, "record", fmt=",.0f")
    ('1 partition', '2 records', '1,234 records')
    """
    shown = format(n, fmt)
    return f"{shown} {noun}" if shown == "1" else f"{shown} {noun}s"
