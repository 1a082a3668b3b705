"""TimerService: the consensus module's timers, fired through the log.

The service schedules a timer with a correlation id and a deadline in cluster time
(epoch milliseconds).  On the leader, an expired timer becomes a TimerEvent appended to
the log, so every member fires it at the same log position; a TimerEvent read from the
log cancels the timer on followers.  Rescheduling an existing correlation id replaces
its deadline.  Pure and deterministic: ties fire in correlation-id order.
"""

from __future__ import annotations

import heapq

POLL_LIMIT = 20
"""Most timers expired by one poll (Aeron's ``TimerService.POLL_LIMIT``)."""


class TimerService:
    __slots__ = ("_deadlines", "_heap")

    def __init__(self) -> None:
        self._deadlines: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._deadlines)

    def schedule(self, correlation_id: int, deadline: int) -> None:
        self._deadlines[correlation_id] = deadline
        heapq.heappush(self._heap, (deadline, correlation_id))
        if len(self._heap) > 2 * len(self._deadlines) + 64:
            # cancelled and rescheduled timers leave stale entries: rebuild
            self._heap = [(d, c) for c, d in self._deadlines.items()]
            heapq.heapify(self._heap)

    def cancel(self, correlation_id: int) -> bool:
        return self._deadlines.pop(correlation_id, None) is not None

    def poll(self, now: int, limit: int = POLL_LIMIT) -> list[tuple[int, int]]:
        """Remove and return up to ``limit`` ``(correlation_id, deadline)`` due at ``now``."""
        expired: list[tuple[int, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(expired) < limit:
            deadline, correlation_id = heapq.heappop(heap)
            if self._deadlines.get(correlation_id) == deadline:
                del self._deadlines[correlation_id]
                expired.append((correlation_id, deadline))
        return expired

    def next_deadline(self) -> int | None:
        heap = self._heap
        while heap and self._deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # drop stale entries left by cancel/reschedule
        return heap[0][0] if heap else None

    def snapshot(self) -> list[tuple[int, int]]:
        """Every live timer as ``(correlation_id, deadline)``, in deadline order."""
        return sorted(self._deadlines.items(), key=lambda item: (item[1], item[0]))
