"""Egress channel: cluster -> client (Aeron template ids 1, 2, 6, 7, 27)."""

from __future__ import annotations

from .._typing import Int32, Int64
from ._base import Message
from .enums import AdminRequestType, AdminResponseCode, EventCode
from .ingress import SessionMessageHeader


class SessionEvent(Message, tag=2):
    """Event about the session itself: OK, ERROR, REDIRECT, AUTHENTICATION_REJECTED, CLOSED."""

    cluster_session_id: Int64
    correlation_id: Int64
    leadership_term_id: Int64
    leader_member_id: Int32
    code: EventCode
    version: Int32
    detail: str = ""
    #: with OK only: the proof of holding the session on another connection
    #: (:class:`~cluster.protocol.ingress.SessionResumeRequest`)
    session_secret: bytes = b""


class NewLeaderEvent(Message, tag=6):
    leadership_term_id: Int64
    cluster_session_id: Int64
    leader_member_id: Int32
    ingress_endpoints: str


class Challenge(Message, tag=7):
    correlation_id: Int64
    cluster_session_id: Int64
    encoded_challenge: bytes = b""


class AdminResponse(Message, tag=27):
    cluster_session_id: Int64
    correlation_id: Int64
    request_type: AdminRequestType
    response_code: AdminResponseCode
    message: str = ""
    payload: bytes = b""


EgressMessage = SessionMessageHeader | SessionEvent | NewLeaderEvent | Challenge | AdminResponse
