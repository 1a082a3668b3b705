"""An HDR-style latency histogram: log-linear buckets, bounded relative error; and the
CPU time a process has used (for the benchmarks).  And :class:`LatencyHistogram`, the
fixed-bucket kind a member keeps for its operators (Prometheus' shape), with
:func:`bucket_quantile` to read one.

Values (e.g. nanoseconds) are counted in buckets whose width doubles every
``2**(precision_bits-1)`` buckets, so every recorded value is known to within
``2**-(precision_bits-1)`` of itself (under 1% with the default 8 bits) whatever its
magnitude, in constant memory.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any


class Histogram:
    __slots__ = ("_counts", "_half", "_sub", "bits", "count", "max", "min", "total")

    def __init__(self, precision_bits: int = 8) -> None:
        if not 2 <= precision_bits <= 16:
            raise ValueError("precision_bits must be in 2..16")
        self.bits = precision_bits
        self._sub = 1 << precision_bits
        self._half = self._sub >> 1
        self._counts: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0

    def _index(self, value: int) -> int:
        if value < self._sub:
            return value
        shift = value.bit_length() - self.bits
        return self._sub + (shift - 1) * self._half + ((value >> shift) - self._half)

    def _lowest(self, index: int) -> int:
        if index < self._sub:
            return index
        shift = (index - self._sub) // self._half + 1
        top = (index - self._sub) % self._half + self._half
        return top << shift

    def _highest(self, index: int) -> int:
        if index < self._sub:
            return index
        shift = (index - self._sub) // self._half + 1
        return self._lowest(index) + (1 << shift) - 1

    def record(self, value: int, count: int = 1) -> None:
        if value < 0:
            raise ValueError(f"cannot record a negative value: {value}")
        value = int(value)
        i = self._index(value)
        self._counts[i] = self._counts.get(i, 0) + count
        if self.count == 0 or value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        self.count += count
        self.total += value * count

    def record_all(self, values: Iterable[int]) -> None:
        """Record many values (the same as :meth:`record` for each, with less overhead)."""
        counts = self._counts
        get = counts.get
        sub, half, bits = self._sub, self._half, self.bits
        lo, hi, n, total = self.min, self.max, self.count, self.total
        try:
            for v in values:
                if v < 0:
                    raise ValueError(f"cannot record a negative value: {v}")
                v = int(v)
                if v < sub:
                    i = v
                else:
                    shift = v.bit_length() - bits
                    i = sub + (shift - 1) * half + ((v >> shift) - half)
                counts[i] = get(i, 0) + 1
                if n == 0 or v < lo:
                    lo = v
                if v > hi:
                    hi = v
                n += 1
                total += v
        finally:  # what was recorded before a bad value stays recorded
            self.min, self.max, self.count, self.total = lo, hi, n, total

    def merge(self, other: Histogram) -> None:
        if other.bits != self.bits:
            raise ValueError("cannot merge histograms of different precision")
        for i, c in other._counts.items():
            self._counts[i] = self._counts.get(i, 0) + c
        if other.count:
            self.min = other.min if self.count == 0 else min(self.min, other.min)
            self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total

    def to_dict(self) -> dict[str, object]:
        """A JSON-able copy (to merge histograms recorded in other processes)."""
        return {
            "bits": self.bits,
            "counts": sorted(self._counts.items()),
            "count": self.count,
            "total": self.total,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        h = cls(int(data["bits"]))
        h._counts = {int(i): int(c) for i, c in data["counts"]}
        h.count, h.total = int(data["count"]), int(data["total"])
        h.min, h.max = int(data["min"]), int(data["max"])
        return h

    def percentile(self, p: float) -> int:
        """Value at percentile ``p`` (0-100): the bucket's highest equivalent value."""
        if not 0 <= p <= 100:
            raise ValueError("percentile must be in 0..100")
        if self.count == 0:
            return 0
        target = max(1, round(self.count * p / 100))
        seen = 0
        for i in sorted(self._counts):
            seen += self._counts[i]
            if seen >= target:
                return min(self._highest(i), self.max)
        return self.max

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def distribution(self) -> list[tuple[float, int]]:
        """``(percentile, value)`` points for a percentile-distribution plot."""
        points = []
        seen = 0
        for i in sorted(self._counts):
            seen += self._counts[i]
            points.append((100.0 * seen / self.count, min(self._highest(i), self.max)))
        return points


def cpu_seconds(pid: int) -> float | None:
    """CPU time used so far by every thread of a process, in seconds: the scheduler's own
    count from /proc/<pid>/task/*/schedstat (exact), else utime + stime (in ticks)."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


LATENCY_BOUNDS_S: tuple[float, ...] = tuple(round(1e-5 * 2**k, 8) for k in range(18))
"""Bucket bounds of a member's latency histograms: 10 µs to 1.31 s, doubling."""


class LatencyHistogram:
    """Counts of durations in the buckets of :data:`LATENCY_BOUNDS_S` (plus one above the
    last), their sum and count: what a Prometheus histogram exports.  One
    :meth:`observe_ns` is a bisect and three additions; only one thread may record into
    a histogram (any may read it)."""

    __slots__ = ("_bounds_ns", "count", "counts", "sum_ns")

    def __init__(self) -> None:
        self._bounds_ns = [round(b * 1e9) for b in LATENCY_BOUNDS_S]
        self.counts = [0] * (len(LATENCY_BOUNDS_S) + 1)
        self.sum_ns = 0
        self.count = 0

    def observe_ns(self, duration_ns: int) -> None:
        duration_ns = max(0, duration_ns)
        self.counts[bisect_left(self._bounds_ns, duration_ns)] += 1
        self.sum_ns += duration_ns
        self.count += 1

    @property
    def bounds(self) -> list[float]:
        return list(LATENCY_BOUNDS_S)


def bucket_quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (0-1) of ``counts`` (per bucket,
    one more than ``bounds``; a value past the last bound reads as the last bound); None
    when nothing was counted."""
    total = sum(counts)
    if total == 0 or not bounds:
        return None
    target = max(1, round(total * q))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= target:
            return bounds[min(i, len(bounds) - 1)]
    return bounds[-1]


def counts_since(now: Sequence[int], before: Sequence[int] | None) -> list[int]:
    """Per-bucket counts between two readings of one histogram (all of ``now`` when there
    is no earlier reading, or when the member restarted and its counts fell)."""
    if before is None or len(before) != len(now):
        return list(now)
    since = [n - b for n, b in zip(now, before, strict=True)]
    return list(now) if min(since, default=0) < 0 else since
