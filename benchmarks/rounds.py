"""Paired rounds: comparing wall-clock rates on a shared, noisy machine.

Each round times every contender once, back to back, so they see the same machine; the
ratio of a round compares like with like. Over several rounds we print each contender's
best rate and, for each ratio, the best-of ratio and the median of the per-round ratios
(with their range): a slow phase of the machine moves one round, not the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["report"]


def report(
    rounds: Sequence[dict[str, float]],
    size: int,
    unit: str,
    ratios: Sequence[tuple[str, str, str]],
) -> None:
    """Print rates and ratios.

    ``rounds`` holds seconds per contender label, one dict per round; ``ratios`` holds
    (label, numerator, denominator) triples over those labels: a ratio is a rate ratio, so
    seconds(denominator) / seconds(numerator).
    """
    labels = list(rounds[0])
    width = max(len(label) for label in [*labels, *(r[0] for r in ratios)]) + 2
    print(f"{len(rounds)} paired rounds; rates are each contender's best")
    for label in labels:
        best = min(r[label] for r in rounds)
        print(f"{label:<{width}}: {size / best:>12,.0f} {unit}s/s")
    for label, num, den in ratios:
        best = min(r[den] for r in rounds) / min(r[num] for r in rounds)
        paired = sorted(r[den] / r[num] for r in rounds)
        print(
            f"{label:<{width}}: {best:.2f} best/best, {statistics.median(paired):.2f} median "
            f"of rounds ({paired[0]:.2f}-{paired[-1]:.2f})"
        )
