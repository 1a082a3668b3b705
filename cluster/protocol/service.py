"""Service <-> consensus module messages (Aeron ids 30-43, 108).

In Triarch the clustered service runs in the node process, so these travel as Python
objects rather than over IPC; they are still real messages with codecs so that a service
container could move out of process without a protocol change.
"""

from __future__ import annotations

from .._typing import Int32, Int64
from ._base import Message


class CloseSession(Message, tag=30):
    cluster_session_id: Int64


class ScheduleTimer(Message, tag=31):
    correlation_id: Int64
    deadline: Int64


class CancelTimer(Message, tag=32):
    correlation_id: Int64


class ServiceAck(Message, tag=33):
    log_position: Int64
    timestamp: Int64
    ack_id: Int64
    relevant_id: Int64
    service_id: Int32


class ClusterMembersQuery(Message, tag=34):
    correlation_id: Int64
    extended: bool = False


class JoinLog(Message, tag=40):
    log_position: Int64
    max_log_position: Int64
    member_id: Int32
    log_session_id: Int32
    log_stream_id: Int32
    is_startup: bool
    role: Int32
    log_channel: str = ""


class ClusterMembersResponse(Message, tag=41):
    correlation_id: Int64
    leader_member_id: Int32
    active_members: str
    passive_followers: str = ""


class ServiceTerminationPosition(Message, tag=42):
    log_position: Int64


class RequestServiceAck(Message, tag=108):
    log_position: Int64


ServiceMessage = (
    CloseSession
    | ScheduleTimer
    | CancelTimer
    | ServiceAck
    | ClusterMembersQuery
    | JoinLog
    | ClusterMembersResponse
    | ServiceTerminationPosition
    | RequestServiceAck
)
