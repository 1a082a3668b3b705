from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.metrics import Histogram, cpu_seconds


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=300))
def test_percentiles_within_relative_error(values: list[int]) -> None:
    h = Histogram(precision_bits=8)
    h.record_all(values)
    ordered = sorted(values)
    for p in (0, 50, 90, 99, 99.9, 100):
        exact = ordered[max(0, round(len(ordered) * p / 100) - 1)]
        got = h.percentile(p)
        assert got >= exact
        assert got <= exact + exact / 128 + 1  # 2**-(bits-1) relative error
    assert h.count == len(values)
    assert h.min == ordered[0]
    assert h.max == ordered[-1]


@given(st.lists(st.integers(min_value=0, max_value=10**12), max_size=200), st.integers(2, 12))
def test_record_all_is_record_for_each(values: list[int], bits: int) -> None:
    one, many = Histogram(bits), Histogram(bits)
    for v in values:
        one.record(v)
    many.record_all(values)
    assert (many.count, many.total, many.min, many.max) == (one.count, one.total, one.min, one.max)
    assert many.distribution() == one.distribution()


def test_round_trip_through_json() -> None:
    import json

    h = Histogram(6)
    h.record_all([1, 5, 900, 10**9])
    copy = Histogram.from_dict(json.loads(json.dumps(h.to_dict())))
    assert copy.distribution() == h.distribution()
    assert (copy.count, copy.total, copy.min, copy.max, copy.bits) == (4, h.total, 1, 10**9, 6)


def test_record_all_keeps_what_came_before_a_bad_value() -> None:
    h = Histogram()
    with pytest.raises(ValueError, match="negative"):
        h.record_all([5, 7, -1, 9])
    assert (h.count, h.min, h.max, h.total) == (2, 5, 7, 12)


def test_merge_and_distribution() -> None:
    a, b = Histogram(), Histogram()
    a.record_all(range(1000))
    b.record_all(range(1000, 2000))
    a.merge(b)
    assert a.count == 2000
    assert a.percentile(50) == pytest.approx(1000, rel=0.01)
    points = a.distribution()
    assert points[-1][0] == pytest.approx(100.0)
    assert [v for _, v in points] == sorted(v for _, v in points)


def test_bad_input() -> None:
    h = Histogram()
    with pytest.raises(ValueError, match="negative"):
        h.record(-1)
    with pytest.raises(ValueError, match="percentile"):
        h.percentile(101)
    with pytest.raises(ValueError, match="precision"):
        Histogram(precision_bits=1)
    assert h.percentile(99) == 0


def test_cpu_seconds_counts_this_process_and_is_none_for_a_process_that_is_gone() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    sum(i * i for i in range(300_000))  # some CPU
    after = cpu_seconds(os.getpid())
    assert after is not None
    assert after > before
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc entry is gone
    assert cpu_seconds(child.pid) is None
