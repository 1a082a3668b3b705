"""Log channel: what the leader appends and every member applies (ids 1, 20-25)."""

from __future__ import annotations

from .._typing import Int32, Int64
from ._base import Message
from .enums import ChangeType, CloseReason, ClusterAction, ClusterTimeUnit
from .ingress import SessionMessageHeader


class TimerEvent(Message, tag=20):
    leadership_term_id: Int64
    correlation_id: Int64
    timestamp: Int64


class SessionOpenEvent(Message, tag=21):
    leadership_term_id: Int64
    correlation_id: Int64
    cluster_session_id: Int64
    timestamp: Int64
    response_stream_id: Int32
    response_channel: str
    encoded_principal: bytes = b""
    #: SHA-256 of the session's secret: any leader can check a resume against it
    secret_hash: bytes = b""


class SessionCloseEvent(Message, tag=22):
    leadership_term_id: Int64
    cluster_session_id: Int64
    timestamp: Int64
    close_reason: CloseReason


class ClusterActionRequest(Message, tag=23):
    leadership_term_id: Int64
    log_position: Int64
    timestamp: Int64
    action: ClusterAction
    flags: Int32 = 0


class NewLeadershipTermEvent(Message, tag=24):
    leadership_term_id: Int64
    log_position: Int64
    timestamp: Int64
    term_base_log_position: Int64
    leader_member_id: Int32
    log_session_id: Int32
    time_unit: ClusterTimeUnit
    app_version: Int32


class MembershipChangeEvent(Message, tag=25):
    leadership_term_id: Int64
    log_position: Int64
    timestamp: Int64
    leader_member_id: Int32
    cluster_size: Int32
    change_type: ChangeType
    member_id: Int32
    cluster_members: str


LogMessage = (
    SessionMessageHeader
    | TimerEvent
    | SessionOpenEvent
    | SessionCloseEvent
    | ClusterActionRequest
    | NewLeadershipTermEvent
    | MembershipChangeEvent
)
