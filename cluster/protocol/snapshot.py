"""Snapshot records (Aeron ids 100-107): consensus module and service snapshots."""

from __future__ import annotations

import msgspec

from .._typing import Int32, Int64
from ._base import Message
from .enums import ClusterTimeUnit, SnapshotMark


class SnapshotMarker(Message, tag=100):
    type_id: Int64  # 1 = consensus module, 2 = clustered service
    log_position: Int64
    leadership_term_id: Int64
    index: Int32
    mark: SnapshotMark
    time_unit: ClusterTimeUnit
    app_version: Int32


class ClientSession(Message, tag=102):
    cluster_session_id: Int64
    response_stream_id: Int32
    response_channel: str
    encoded_principal: bytes = b""
    secret_hash: bytes = b""
    #: the highest sequence of the session's messages applied (0 in snapshots taken
    #: before protocol 2: none was numbered)
    last_sequence: Int64 = 0
    #: the number of the session's last reply, and the highest its client confirmed
    last_reply: Int64 = 0
    confirmed_reply: Int64 = 0
    #: the replies kept for it (exactly once out), each as its egress encoding
    replies: list[bytes] = msgspec.field(default_factory=list)


class ClusterSessionSnapshot(Message, tag=103):
    """Aeron's ``ClusterSession`` snapshot record (renamed to avoid the core class)."""

    cluster_session_id: Int64
    correlation_id: Int64
    opened_log_position: Int64
    time_of_last_activity: Int64
    close_reason: Int32  # a CloseReason value, or -1 (NULL) while OPEN
    response_stream_id: Int32
    response_channel: str


class Timer(Message, tag=104):
    correlation_id: Int64
    deadline: Int64


class ConsensusModuleState(Message, tag=105):
    next_session_id: Int64
    next_service_session_id: Int64
    log_service_session_id: Int64
    pending_message_capacity: Int32


class ClusterMembers(Message, tag=106):
    member_id: Int32
    high_member_id: Int32
    cluster_members: str


class PendingMessageTracker(Message, tag=107):
    next_service_session_id: Int64
    log_service_session_id: Int64
    pending_message_capacity: Int32
    service_id: Int32


class PendingMessage(Message, tag=109):
    """A service message offered but not yet applied from the log."""

    seq: Int64
    payload: bytes


class ServiceState(Message, tag=110):
    """Opaque bytes written by a service's ``on_take_snapshot``."""

    data: bytes


SnapshotRecord = (
    SnapshotMarker
    | ClientSession
    | ClusterSessionSnapshot
    | Timer
    | ConsensusModuleState
    | ClusterMembers
    | PendingMessageTracker
    | PendingMessage
    | ServiceState
)
