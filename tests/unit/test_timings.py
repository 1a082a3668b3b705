"""A member's latency histograms (issue #21): what the node feeds them and what they read."""

from __future__ import annotations

from cluster.agents.timings import MAX_MARKS, Timings
from cluster.core.tracker import Progress
from cluster.metrics import LATENCY_BOUNDS_S, LatencyHistogram, bucket_quantile, counts_since

MS = 1_000_000


def test_buckets_count_a_value_at_or_below_their_bound() -> None:
    h = LatencyHistogram()
    h.observe_ns(10_000)  # exactly the first bound: the first bucket
    h.observe_ns(10_001)
    h.observe_ns(10**10)  # past the last bound: +Inf
    h.observe_ns(-5)  # a clock that went back counts as 0
    assert h.counts[0] == 2
    assert h.counts[1] == 1
    assert h.counts[-1] == 1
    assert h.count == 4
    assert h.sum_ns == 10_000 + 10_001 + 10**10
    assert len(h.counts) == len(LATENCY_BOUNDS_S) + 1


def test_quantile_and_difference_of_two_readings() -> None:
    bounds = [0.001, 0.002, 0.004]
    assert bucket_quantile(bounds, [0, 0, 0, 0], 0.99) is None
    assert bucket_quantile(bounds, [98, 1, 1, 0], 0.5) == 0.001
    assert bucket_quantile(bounds, [98, 1, 1, 0], 0.99) == 0.002
    assert bucket_quantile(bounds, [0, 0, 0, 5], 0.5) == 0.004  # +Inf reads as the last
    assert counts_since([5, 6, 7, 8], [1, 1, 1, 1]) == [4, 5, 6, 7]
    assert counts_since([1, 0, 0, 0], [5, 6, 7, 8]) == [1, 0, 0, 0]  # a restart
    assert counts_since([1, 2], None) == [1, 2]


def test_commit_latency_is_observed_once_per_publication() -> None:
    t = Timings()
    t.published(100, 0)
    t.published(100, 1 * MS)  # nothing new: no mark
    t.published(250, 2 * MS)
    t.published(400, 3 * MS)
    t.committed(99, 4 * MS)
    assert t.commit.count == 0
    t.committed(250, 5 * MS)  # the marks at 100 and 250: 5 ms and 3 ms
    assert t.commit.count == 2
    assert t.commit.sum_ns == 8 * MS
    t.committed(250, 9 * MS)
    assert t.commit.count == 2
    t.committed(1000, 10 * MS)
    assert t.commit.count == 3
    assert t.commit.sum_ns == 15 * MS


def test_replication_lag_is_the_age_of_the_oldest_log_not_confirmed() -> None:
    t = Timings()
    for i in range(1, 11):
        t.published(i * 100, i * MS)
    t.committed(1000, 11 * MS)
    slow, fast, unknown = Progress(1, 0, 0), Progress(2, 0, 0), Progress(3, 0, 0)
    slow.match_position, fast.match_position = 350, 1000
    assert t.lag_ns(350, 20 * MS) == 16 * MS  # 400 was published at 4 ms
    assert t.lag_ns(1000, 20 * MS) == 0
    t.sample([slow, fast, unknown], 20 * MS)
    assert t.replication[1].count == 1
    assert t.replication[1].sum_ns == 16 * MS
    assert t.replication[2].count == 1
    assert t.replication[2].sum_ns == 0
    assert 3 not in t.replication  # a follower that has not reported yet
    # the marks the slow follower still lacks are kept
    assert t.lag_ns(350, 30 * MS) == 26 * MS


def test_marks_are_bounded_and_a_role_change_forgets_them() -> None:
    t = Timings()
    for i in range(1, MAX_MARKS + 10):
        t.published(i, i)
    assert len(t._positions) <= MAX_MARKS
    t.committed(MAX_MARKS + 10, MAX_MARKS + 10)
    assert t.commit.count <= MAX_MARKS
    t.reset()
    assert t.lag_ns(0, 0) == 0
    t.saw_leader(1, 0)
    t.saw_leader(1, 0)
    t.saw_leader(2, 0)  # re-elected in a new term: a change
    t.saw_leader(2, -1)  # no leader: not a change
    assert t.leader_changes == 2


def test_statuses_carry_every_histogram_in_prometheus_shape() -> None:
    t = Timings()
    t.duty_cycle.observe_ns(50_000)
    t.replication[2] = LatencyHistogram()
    sync = LatencyHistogram()
    names = [(h.name, h.labels) for h in t.statuses(sync)]
    assert names == [
        ("fsync", {}),
        ("duty_cycle", {}),
        ("commit", {}),
        ("replication", {"follower": "2"}),
    ]
    duty = t.statuses(sync)[1]
    assert duty.count == 1
    assert duty.sum == 50e-6
    assert len(duty.counts) == len(duty.bounds) + 1
