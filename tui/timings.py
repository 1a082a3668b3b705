"""Times read from a member's latency histograms, over the last few seconds of polls.

A member's ``describe`` carries its histograms (:class:`~cluster.protocol.admin.HistogramStatus`,
Prometheus' shape: counts per bucket since the member started).  The console keeps the
readings of the last ``window`` seconds and, for each histogram, takes the difference
between the newest reading and the oldest one kept (:func:`cluster.metrics.counts_since`):
the p99 is the bound of the bucket that holds it (:func:`cluster.metrics.bucket_quantile`,
so "≤ 2.6 ms"), the mean is the difference of the sums over that of the counts.  A
histogram with nothing counted in the window reads as idle; a restarted member (another
pid) starts over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.metrics import bucket_quantile, counts_since
from cluster.protocol.admin import HistogramStatus

__all__ = ["HistogramWindow", "Timing", "fmt_seconds", "timing_text"]

_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Timing:
    """One histogram over the window: how many values, their p99 bucket bound and mean."""

    count: int
    p99: float | None  # seconds: the upper bound of the bucket holding the 99th percentile
    mean: float | None  # seconds
    seconds: float  # the window it covers


@dataclass(frozen=True, slots=True)
class _Reading:
    at: float
    pid: int
    values: dict[_Key, tuple[list[float], list[int], float, int]]


def _key(h: HistogramStatus) -> _Key:
    return h.name, tuple(sorted(h.labels.items()))


class HistogramWindow:
    """The readings of one member's histograms over the last ``window`` seconds."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self._readings: deque[_Reading] = deque()

    def add(self, at: float, pid: int, histograms: Sequence[HistogramStatus]) -> None:
        values = {_key(h): (list(h.bounds), list(h.counts), h.sum, h.count) for h in histograms}
        readings = self._readings
        if readings and readings[-1].pid != pid:
            readings.clear()  # restarted: its counts start from zero again
        readings.append(_Reading(at, pid, values))
        # keep one reading at least ``window`` old as the baseline
        while len(readings) > 2 and at - readings[1].at >= self.window:
            readings.popleft()

    def clear(self) -> None:
        self._readings.clear()

    def timing(self, name: str, **labels: str) -> Timing | None:
        """``name``'s values since the oldest reading kept; None before two readings, or
        when the member does not keep that histogram."""
        if len(self._readings) < 2:
            return None
        key: _Key = (name, tuple(sorted(labels.items())))
        old, new = self._readings[0], self._readings[-1]
        now = new.values.get(key)
        if now is None:
            return None
        bounds, counts, total, count = now
        before = old.values.get(key)
        delta = counts_since(counts, before[1] if before else None)
        restarted = before is None or count < before[3] or sum(delta) != count - before[3]
        if before is not None and not restarted:
            delta_sum, delta_count = total - before[2], count - before[3]
        else:  # no earlier reading, or the counts fell: everything since the start
            delta_sum, delta_count = total, count
        mean = delta_sum / delta_count if delta_count > 0 else None
        p99 = bucket_quantile(bounds, delta, 0.99)
        return Timing(delta_count, p99, mean, new.at - old.at)

    def names(self) -> list[_Key]:
        return list(self._readings[-1].values) if self._readings else []


def fmt_seconds(seconds: float | None) -> str:
    """``850µs``, ``2.6ms``, ``1.3s``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1.0:
        value = seconds * 1e3
        return f"{value:.1f}ms" if value < 100 else f"{value:.0f}ms"
    return f"{seconds:.1f}s" if seconds < 100 else f"{seconds:.0f}s"


def timing_text(timing: Timing | None) -> str:
    """``p99≤2.6ms x̄0.9ms``; ``idle`` when nothing was counted; ``-`` when unknown."""
    if timing is None:
        return "-"
    if timing.count == 0:
        return "idle"
    return f"p99≤{fmt_seconds(timing.p99)} x̄{fmt_seconds(timing.mean)}"
