"""The chart of docs/benchmarks.md: flowkit against the hand-written loop, per benchmark.

    python -m benchmarks.chart            # writes docs/images/benchmarks.svg

The figures below are copied from docs/benchmarks.md (the median of paired rounds and
their range); update both together. The SVG is written by hand:
no plotting library is a dependency.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent.parent / "docs" / "images" / "benchmarks.svg"


class Ratio(NamedTuple):
    label: str
    median: float
    low: float
    high: float
    target: float
    unit: str = "wall clock"


# flowkit / hand-written, same data, same run: the figures of docs/benchmarks.md.
RESULTS = [
    Ratio("YSB, memory broker", 0.92, 0.92, 0.92, 0.8, "instructions"),
    Ratio("YSB, memory broker", 0.80, 0.79, 0.80, 0.8, "CPU time"),
    Ratio("YSB, memory, per-record", 0.84, 0.82, 0.85, 0.8, "CPU time"),
    Ratio("YSB, Kafka, aiokafka", 1.98, 1.89, 2.12, 0.8),
    Ratio("YSB, Kafka, aiokafka", 1.67, 1.56, 1.76, 0.8, "CPU time"),
    Ratio("YSB, Kafka, librdkafka", 0.95, 0.83, 1.02, 0.8),
    Ratio("YSB, Kafka, librdkafka", 1.03, 0.86, 1.08, 0.8, "CPU time"),
    Ratio("Router, Kafka, aiokafka", 0.96, 0.75, 1.13, 0.8),
    Ratio("Router, Kafka, aiokafka", 0.95, 0.74, 1.13, 0.8, "CPU time"),
    Ratio("Router, Kafka, librdkafka", 0.87, 0.58, 1.02, 0.8),
    Ratio("Router, Kafka, librdkafka", 0.90, 0.61, 1.11, 0.8, "CPU time"),
    Ratio("Table recovery, memory", 0.93, 0.93, 0.93, 0.8, "CPU time"),
]

_ROW = 34
_LEFT = 230
_WIDTH = 420  # the plot area
_MAX = 2.0  # the ratio at the right edge


def _x(ratio: float) -> float:
    return _LEFT + _WIDTH * min(ratio, _MAX) / _MAX


def svg(results: list[Ratio]) -> str:
    height = 80 + _ROW * len(results)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _WIDTH + 40}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{_LEFT}" y="20" font-weight="bold">flowkit / hand-written loop '
        "(median of paired rounds, range)</text>",
    ]
    top = 34
    for tick in (0.0, 0.4, 0.8, 1.2, 1.6, 2.0):
        x = _x(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - 38}" '
            'stroke="#ddd" stroke-width="1"/>'
        )
        parts.append(f'<text x="{x:.1f}" y="{height - 22}" text-anchor="middle">{tick:.1f}</text>')
    for i, r in enumerate(results):
        y = top + 6 + i * _ROW
        label = escape(f"{r.label} ({r.unit})")
        parts.append(f'<text x="{_LEFT - 8}" y="{y + 14}" text-anchor="end">{label}</text>')
        color = "#2b7a3d" if r.median >= r.target else "#c0392b"
        parts.append(
            f'<rect x="{_LEFT}" y="{y}" width="{_x(r.median) - _LEFT:.1f}" height="18" '
            f'fill="{color}" opacity="0.8"/>'
        )
        if r.high > r.low:
            parts.append(
                f'<line x1="{_x(r.low):.1f}" y1="{y + 9}" x2="{_x(r.high):.1f}" y2="{y + 9}" '
                'stroke="black" stroke-width="1.5"/>'
            )
        parts.append(
            f'<text x="{_x(r.median) + 4:.1f}" y="{y - 2}" font-size="11">{r.median:.3g}</text>'
        )
        t = _x(r.target)
        parts.append(
            f'<line x1="{t:.1f}" y1="{y - 3}" x2="{t:.1f}" y2="{y + 21}" '
            'stroke="black" stroke-dasharray="3,2" stroke-width="1.5"/>'
        )
    parts.append(
        f'<text x="{_LEFT}" y="{height - 5}" font-size="11" fill="#555">dashed: the '
        "target; green: the median meets it; 1.0 = as fast as the hand-written loop</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    argparse.ArgumentParser(description="writes docs/images/benchmarks.svg").parse_args()
    OUT.write_text(svg(RESULTS))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
