"""TimerService: the consensus module's timers, fired through the log.

The service schedules a timer with a correlation id and a deadline in cluster time
(epoch milliseconds).  On the leader, an expired timer becomes a TimerEvent appended to
the log, so every member fires it at the same log position; a TimerEvent read from the
log cancels the timer on followers.  Rescheduling an existing correlation id replaces
its deadline.  Pure and deterministic: ties fire in correlation-id order.

A timer the leader has fired stays *fired-pending* until its TimerEvent is applied
(committed): if the leader steps down first, :meth:`restore_fired` makes it live again
so the next leader fires it.  A TimerEvent applied from the log cancels the timer,
fired-pending or live (as Aeron does, also when it was rescheduled meanwhile).
"""

from __future__ import annotations

import heapq

POLL_LIMIT = 20
"""Most timers expired by one poll (Aeron's ``TimerService.POLL_LIMIT``)."""


class TimerService:
    __slots__ = ("_deadlines", "_fired", "_heap")

    def __init__(self) -> None:
        self._deadlines: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self._fired: dict[int, int] = {}

    def __len__(self) -> int:
        """Live timers (not counting fired-pending ones)."""
        return len(self._deadlines)

    def schedule(self, correlation_id: int, deadline: int) -> None:
        self._fired.pop(correlation_id, None)
        self._deadlines[correlation_id] = deadline
        heapq.heappush(self._heap, (deadline, correlation_id))
        if len(self._heap) > 2 * len(self._deadlines) + 64:
            # cancelled and rescheduled timers leave stale entries: rebuild
            self._heap = [(d, c) for c, d in self._deadlines.items()]
            heapq.heapify(self._heap)

    def cancel(self, correlation_id: int) -> bool:
        fired = self._fired.pop(correlation_id, None) is not None
        return self._deadlines.pop(correlation_id, None) is not None or fired

    def restore_fired(self) -> int:
        """Make fired-but-uncommitted timers live again (the leader stepped down)."""
        restored = self._fired
        self._fired = {}
        for correlation_id, deadline in restored.items():
            self.schedule(correlation_id, deadline)
        return len(restored)

    def poll(self, now: int, limit: int = POLL_LIMIT) -> list[tuple[int, int]]:
        """Remove and return up to ``limit`` ``(correlation_id, deadline)`` due at ``now``."""
        expired: list[tuple[int, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(expired) < limit:
            deadline, correlation_id = heapq.heappop(heap)
            if self._deadlines.get(correlation_id) == deadline:
                del self._deadlines[correlation_id]
                self._fired[correlation_id] = deadline
                expired.append((correlation_id, deadline))
        return expired

    def next_deadline(self) -> int | None:
        heap = self._heap
        while heap and self._deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # drop stale entries left by cancel/reschedule
        return heap[0][0] if heap else None

    def snapshot(self) -> list[tuple[int, int]]:
        """Every timer not yet applied as fired, ``(correlation_id, deadline)`` by deadline."""
        timers = {**self._deadlines, **self._fired}
        return sorted(timers.items(), key=lambda item: (item[1], item[0]))
