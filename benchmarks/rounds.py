"""Paired rounds: comparing wall-clock rates on a shared, noisy machine.

Each round times every contender once, back to back, so they see the same machine; the
ratio of a round compares like with like. Over several rounds we print each contender's
best rate and, for each ratio, the best-of ratio and the median of the per-round ratios
(with their range): a slow phase of the machine moves one round, not the median.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Sequence

__all__ = ["against_hand_written", "report"]


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


def against_hand_written(
    repeat: int,
    size: int,
    unit: str,
    hand: Callable[[], tuple[float, object]],
    flowkit: Callable[[], tuple[float, object, float]],
    mismatch: str,
    others: Sequence[tuple[str, Callable[[], tuple[float, object, float]]]] = (),
    between: Sequence[tuple[str, str, str]] = (),
) -> None:
    """Run ``repeat`` paired rounds of a hand-written loop and flowkit, then ``report``.

    ``hand()`` returns (seconds, result); ``flowkit()`` returns (seconds, result, seconds
    of the hand-written loop over the broker's logs). The results must be equal in every
    round, or the run stops with ``mismatch``. ``others``: more flowkit forms, (label,
    function) pairs called like ``flowkit`` in the same rounds (the order of the flowkit
    forms reversed every other round), their results checked the same way and their
    ratios printed after flowkit's; ``between``: more (label, numerator, denominator)
    ratios, among the flowkit forms.
    """
    rounds = []
    forms = [("flowkit", flowkit), *others]
    for n in range(repeat):
        gc.collect()
        t_hand, expected = hand()
        times = {"hand-written (list)": t_hand}
        # The flowkit forms in turn, in reverse order every other round: none always
        # runs on the heap the one before it left.
        for label, run in forms if n % 2 == 0 else forms[::-1]:
            gc.collect()
            t, got, t_logs = run()
            if got != expected:
                raise SystemExit(mismatch if label == "flowkit" else f"{mismatch} ({label})")
            times[label] = t
            if label == "flowkit":
                times["hand-written (logs)"] = t_logs
        rounds.append(
            {k: times[k] for k in ["hand-written (list)", "hand-written (logs)", *dict(forms)]}
        )
    ratios = []
    for label in ["flowkit", *(label for label, _ in others)]:
        ratios += [
            (f"{label} / hand-written (list)", label, "hand-written (list)"),
            (f"{label} / hand-written (logs)", label, "hand-written (logs)"),
        ]
    ratios += between
    report(rounds, size, unit, ratios)
    if all(hasattr(t, "cpu") for r in rounds for t in r.values()):
        # The seconds carry the process's CPU seconds too: the same rounds in CPU time,
        # which other processes on a shared machine move far less than wall-clock time.
        print("the same rounds in CPU time of the process:")
        report([{k: t.cpu for k, t in r.items()} for r in rounds], size, unit, ratios)  # type: ignore[attr-defined]
