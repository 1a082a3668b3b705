"""PendingServiceMessageTracker: service messages on their way into the log, exactly once.

``Cluster.offer(payload)`` from a service is a message the cluster must sequence like
client input.  Every member's service makes the same offers at the same log positions
(services are deterministic), so every member numbers them identically: message ``seq``
goes into the log as a SessionMessageHeader whose ``cluster_session_id`` is ``-seq``
(negative: never a client session).  Only the leader appends them; every member sweeps
a message from its pending list once it is applied from the log.  A new leader appends
whatever is still pending after its log is applied, so a message offered before a
failover is logged once: neither lost nor twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator


def service_session_id(seq: int) -> int:
    return -seq


def is_service_message(cluster_session_id: int) -> bool:
    return cluster_session_id < 0


class PendingServiceMessageTracker:
    __slots__ = ("_appended", "_pending", "log_service_session_id", "next_service_session_id")

    def __init__(self) -> None:
        self.next_service_session_id = 1  # seq of the next offered message
        self.log_service_session_id = 0  # highest seq applied from the log
        self._pending: deque[tuple[int, bytes]] = deque()
        self._appended = 0  # highest seq the leader has appended in its term

    def __len__(self) -> int:
        return len(self._pending)

    def enqueue(self, payload: bytes) -> int:
        seq = self.next_service_session_id
        self.next_service_session_id += 1
        self._pending.append((seq, payload))
        return seq

    def sweep(self, seq: int) -> None:
        """Message ``seq`` was applied from the log: it and every earlier one are done."""
        if seq > self.log_service_session_id:
            self.log_service_session_id = seq
        pending = self._pending
        while pending and pending[0][0] <= seq:
            pending.popleft()

    def take_unappended(self) -> Iterator[tuple[int, bytes]]:
        """Leader: messages not yet in the log nor appended in this term."""
        floor = max(self._appended, self.log_service_session_id)
        for seq, payload in self._pending:
            if seq > floor:
                self._appended = seq
                yield seq, payload

    def reset_appended(self) -> None:
        """A new term: nothing is known appended beyond what the log holds."""
        self._appended = self.log_service_session_id

    def pending(self) -> list[tuple[int, bytes]]:
        return list(self._pending)

    def restore(self, next_seq: int, log_seq: int, pending: list[tuple[int, bytes]]) -> None:
        """Load from a snapshot."""
        self.next_service_session_id = next_seq
        self.log_service_session_id = log_seq
        self._pending = deque(pending)
        self._appended = log_seq
