"""TimerService: deadline order, reschedule, cancel, poll limit, and a model test."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster.core.timers import POLL_LIMIT, TimerService


def test_fires_in_deadline_order_ties_by_correlation_id() -> None:
    timers = TimerService()
    for correlation_id, deadline in [(5, 30), (1, 10), (9, 20), (3, 20), (7, 10)]:
        timers.schedule(correlation_id, deadline)
    assert len(timers) == 5
    assert timers.next_deadline() == 10
    assert timers.poll(9) == []
    assert timers.poll(20) == [(1, 10), (7, 10), (3, 20), (9, 20)]
    assert len(timers) == 1
    assert timers.next_deadline() == 30
    assert timers.poll(1_000) == [(5, 30)]
    assert len(timers) == 0
    assert timers.next_deadline() is None
    assert timers.poll(10**18) == []


def test_deadline_equal_to_now_is_due() -> None:
    timers = TimerService()
    timers.schedule(1, 100)
    assert timers.poll(99) == []
    assert timers.poll(100) == [(1, 100)]


def test_reschedule_replaces_deadline() -> None:
    timers = TimerService()
    timers.schedule(1, 10)
    timers.schedule(1, 50)
    assert len(timers) == 1
    assert timers.next_deadline() == 50
    assert timers.poll(40) == []
    assert timers.poll(50) == [(1, 50)]
    assert timers.poll(100) == []  # the old deadline's heap entry is stale

    timers.schedule(2, 50)
    timers.schedule(2, 5)  # earlier works too
    assert timers.poll(5) == [(2, 5)]
    assert timers.poll(50) == []


def test_reschedule_to_same_deadline_fires_once() -> None:
    timers = TimerService()
    timers.schedule(1, 10)
    timers.schedule(1, 10)
    timers.cancel(1)
    timers.schedule(1, 10)
    assert timers.poll(10) == [(1, 10)]
    assert timers.poll(10) == []
    assert len(timers) == 0


def test_cancel() -> None:
    timers = TimerService()
    timers.schedule(1, 10)
    timers.schedule(2, 20)
    assert timers.cancel(1)
    assert not timers.cancel(1)
    assert not timers.cancel(99)
    assert len(timers) == 1
    assert timers.next_deadline() == 20
    assert timers.poll(100) == [(2, 20)]
    assert timers.cancel(2)  # fired-pending until its TimerEvent is applied
    assert not timers.cancel(2)
    assert timers.snapshot() == []


def test_poll_limit() -> None:
    timers = TimerService()
    for i in range(POLL_LIMIT + 5):
        timers.schedule(i, i)
    assert POLL_LIMIT == 20
    first = timers.poll(1_000)
    assert first == [(i, i) for i in range(POLL_LIMIT)]
    assert timers.poll(1_000) == [(i, i) for i in range(POLL_LIMIT, POLL_LIMIT + 5)]
    for i in range(10):
        timers.schedule(i, 0)
    assert timers.poll(0, limit=3) == [(0, 0), (1, 0), (2, 0)]
    assert len(timers) == 7


def test_stale_entries_do_not_count_against_the_limit() -> None:
    timers = TimerService()
    for i in range(30):
        timers.schedule(i, 1)
        timers.cancel(i)
    timers.schedule(100, 2)
    assert timers.poll(5, limit=1) == [(100, 2)]


def test_snapshot_lists_live_timers_in_deadline_order() -> None:
    timers = TimerService()
    timers.schedule(3, 30)
    timers.schedule(1, 10)
    timers.schedule(2, 10)
    timers.schedule(4, 5)
    timers.cancel(4)
    timers.schedule(1, 40)
    assert timers.snapshot() == [(2, 10), (3, 30), (1, 40)]


# ---------------------------------------------------------------------- model test


class TimerModel(RuleBasedStateMachine):
    """TimerService against a dict of correlation id -> deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.timers = TimerService()
        self.model: dict[int, int] = {}
        self.fired: dict[int, int] = {}  # fired, TimerEvent not yet applied

    ids = st.integers(0, 12)
    times = st.integers(-5, 60)

    @rule(correlation_id=ids, deadline=times)
    def schedule(self, correlation_id: int, deadline: int) -> None:
        self.timers.schedule(correlation_id, deadline)
        self.model[correlation_id] = deadline
        self.fired.pop(correlation_id, None)

    @rule(correlation_id=ids)
    def cancel(self, correlation_id: int) -> None:
        live = self.model.pop(correlation_id, None) is not None
        fired = self.fired.pop(correlation_id, None) is not None
        assert self.timers.cancel(correlation_id) is (live or fired)

    @rule()
    def restore_fired(self) -> None:
        assert self.timers.restore_fired() == len(self.fired)
        self.model.update(self.fired)
        self.fired.clear()

    @rule(now=times, limit=st.integers(1, 6))
    def poll(self, now: int, limit: int) -> None:
        due = sorted(
            ((cid, d) for cid, d in self.model.items() if d <= now),
            key=lambda item: (item[1], item[0]),
        )[:limit]
        assert self.timers.poll(now, limit) == due
        for cid, deadline in due:
            del self.model[cid]
            self.fired[cid] = deadline

    @rule()
    def peek(self) -> None:
        expected = min(self.model.values()) if self.model else None
        assert self.timers.next_deadline() == expected

    @invariant()
    def agrees(self) -> None:
        assert len(self.timers) == len(self.model)
        assert self.timers.snapshot() == sorted(
            {**self.model, **self.fired}.items(), key=lambda item: (item[1], item[0])
        )


TestTimerModel = TimerModel.TestCase
TestTimerModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
