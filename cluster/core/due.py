"""What a ready leader puts on the log by itself: the service messages its service
offered (``Cluster.offer``, pending on every member with the same sequence number) and
the timers that have expired, each as a log entry of the leader's term."""

from __future__ import annotations

from ..protocol.ingress import SessionMessageHeader
from ..protocol.log import TimerEvent
from .log import ReplicatedLog
from .pending import PendingServiceMessageTracker, service_session_id
from .timers import TimerService


def append_due(
    rlog: ReplicatedLog,
    term: int,
    service_messages: PendingServiceMessageTracker,
    timers: TimerService,
    now_ns: int,
) -> int:
    """Append the pending service messages and the expired timers; returns how many."""
    work = 0
    if len(service_messages):
        for seq, payload in service_messages.take_unappended():
            header = SessionMessageHeader(
                term, service_session_id(seq), rlog.cluster_time(now_ns), payload
            )
            rlog.append(header, True)
            work += 1
    if not len(timers):
        return work
    now_ms = rlog.cluster_time(now_ns)
    expired = timers.poll(now_ms)
    for correlation_id, _deadline in expired:
        rlog.timestamp = now_ms
        rlog.append(TimerEvent(term, correlation_id, now_ms), True)
    return work + len(expired)
