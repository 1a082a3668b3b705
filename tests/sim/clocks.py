"""Clock steps in the simulator (issue 44, item 5) and what is checked of them.

Cluster time is the leader's wall clock (Aeron's cluster clock), never behind the last
timestamp of the log.  The fault :data:`CLOCK_STEP` steps one member's wall clock (the
leader half the time) back or forward by up to three minutes, and half the time another
member's the other way; their monotonic clocks, and so every timeout, go on as before.
A seed that draws it also runs the workload's own cluster timers: every third write
schedules one (a correlation id of its own, never rescheduled) due up to a second after
the write's cluster time.

Invariant 11, checked on the committed log as it grows and at the end of the run:

* the log's timestamps never decrease, across the whole log, leader changes included;
* a timer fires (its TimerEvent is committed) only once cluster time has reached its
  deadline, and once;
* every timer due a second before the leader's cluster time at the end has fired.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from cluster.protocol.log import TimerEvent

CLOCK_STEP = "clock-step"
"""A member's wall clock steps back or jumps forward (drawn for about a third of the
seeds, from an RNG of its own, as the power cut and the cluster stop are)."""

TIMER_BASE = 1 << 40
"""The workload's timers' correlation ids: ``TIMER_BASE`` + the log position of the write
that scheduled it (the KV service's own TTL timers count from 1)."""

STEPS_S = (1.0, 10.0, 60.0, 180.0)
"""How far a step goes, before a random share of it (half to all)."""

DUE_SLACK_MS = 1_000
"""At the end, a timer due this long before the leader's cluster time must have fired."""


def draw_step(rng: random.Random) -> int:
    """A wall-clock step in ns: back or forward, by up to three minutes."""
    seconds = rng.choice(STEPS_S) * rng.uniform(0.5, 1.0)
    return int(seconds * 1e9) * rng.choice((-1, 1))


def timer_for(position: int, request_id: int, timestamp: int) -> tuple[int, int] | None:
    """``(correlation id, deadline)`` of the timer the write at ``position`` schedules, if
    any: every third request, due up to a second after the write's cluster time."""
    if request_id % 3:
        return None
    return TIMER_BASE + position, timestamp + position % 1_000


class ClockChecker:
    """Invariant 11 over the committed log (:meth:`on_record`, in log order) and the
    timers the members' services scheduled (:meth:`scheduled`)."""

    def __init__(self, fail: Callable[[str], None]) -> None:
        self.fail = fail
        self.last_timestamp = 0
        self.last_at = 0
        self.deadlines: dict[int, int] = {}
        """Correlation id -> deadline, as the services scheduled it (all alike)."""
        self.fired: dict[int, int] = {}
        """Correlation id -> the log position of its committed TimerEvent."""

    def on_record(self, end: int, record: Any) -> None:
        timestamp = record.timestamp
        if timestamp < self.last_timestamp:
            self.fail(
                f"cluster time went back in the log: {type(record).__name__} at {end} has "
                f"timestamp {timestamp}, {self.last_timestamp - timestamp} ms before the "
                f"entry at {self.last_at}"
            )
        self.last_timestamp, self.last_at = timestamp, end
        if type(record) is TimerEvent and record.correlation_id >= TIMER_BASE:
            cid = record.correlation_id
            deadline = self.deadlines.get(cid)
            if deadline is None:
                self.fail(f"timer {cid} fired at {end}, never scheduled")
            elif timestamp < deadline:
                self.fail(
                    f"timer {cid} fired at {end} at cluster time {timestamp}, "
                    f"{deadline - timestamp} ms before its deadline"
                )
            first = self.fired.setdefault(cid, end)
            if first != end:
                self.fail(f"timer {cid} fired twice: at {first} and at {end}")

    def scheduled(self, member: int, correlation_id: int, deadline: int) -> None:
        first = self.deadlines.setdefault(correlation_id, deadline)
        if first != deadline:
            self.fail(
                f"n{member} scheduled timer {correlation_id} for {deadline}, another "
                f"member for {first}"
            )

    def overdue(self, now_ms: int) -> list[int]:
        """The timers due :data:`DUE_SLACK_MS` before ``now_ms`` that have not fired."""
        due = now_ms - DUE_SLACK_MS
        return [c for c, d in self.deadlines.items() if d <= due and c not in self.fired]
