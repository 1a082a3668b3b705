"""The throughput graph: bars of block characters on a printed scale.

The scale is the larger of the recent maximum and a floor (1 KiB/s by default), rounded
up to 1, 2 or 5 times a power of ten (or of 1024 for the binary units), so a 63 B/s blip
of an idle cluster stays a sliver at the bottom instead of filling the height, and the
top of the graph always says what it stands for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["BLOCKS", "GRAPH_FLOOR", "bars", "fmt_rate", "nice_scale"]

GRAPH_FLOOR = 1024.0  # bytes/s: the least the graph's full height stands for
BLOCKS = " ▁▂▃▄▅▆▇█"


def nice_scale(samples: Sequence[float], floor: float = GRAPH_FLOOR) -> float:
    """The value of the graph's full height: max(recent max, floor), rounded up to 1, 2
    or 5 times a power of 1024 times a power of ten (1 KiB/s, 2 KiB/s, 5 KiB/s, 10 KiB/s...)."""
    top = max([floor, *samples])
    base = 1.0
    while top / base >= 1024:
        base *= 1024
    value = top / base
    exponent = 10 ** math.floor(math.log10(value)) if value > 0 else 1
    for step in (1, 2, 5, 10):
        if value <= step * exponent:
            return step * exponent * base
    return 10 * exponent * base  # pragma: no cover - the loop ends at 10


def bars(samples: Sequence[float], scale: float, height: int, width: int) -> list[str]:
    """``height`` rows of ``width`` characters, top row first: the last ``width`` samples
    as columns (right-aligned, newest at the right) of eighth-blocks against ``scale``."""
    recent = list(samples)[-width:]
    columns = [" " * height] * (width - len(recent))
    eighths_total = height * 8
    for value in recent:
        filled = 0 if scale <= 0 else round(max(0.0, value) / scale * eighths_total)
        if value > 0 and filled == 0:
            filled = 1  # something, however little, shows
        filled = min(filled, eighths_total)
        column = ""
        for row in range(height):  # bottom row first
            part = min(8, max(0, filled - row * 8))
            column += BLOCKS[part]
        columns.append(column[::-1])
    return ["".join(c[r] for c in columns) for r in range(height)]


def fmt_rate(value: float | None, unit: str) -> str:
    """``63 B/s``, ``1.5 KiB/s``; ``-`` for None."""
    if value is None:
        return "-"
    for prefix in ("", "Ki", "Mi", "Gi"):
        if value < 1024 or prefix == "Gi":
            return f"{value:,.0f} {prefix}{unit}" if not prefix else f"{value:.1f} {prefix}{unit}"
        value /= 1024
    raise AssertionError("unreachable")
