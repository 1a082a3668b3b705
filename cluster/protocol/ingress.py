"""Ingress channel: client -> cluster (Aeron template ids 1-8, 26)."""

from __future__ import annotations

from .._typing import Int32, Int64
from ._base import Message
from .enums import AdminRequestType


class SessionMessageHeader(Message, tag=1):
    """Envelope of an application message, on ingress, the log and egress.

    The client sends ``timestamp`` 0; the leader stamps the cluster time when it appends
    the message to the log, and the service's egress replies carry the timestamp of the
    log entry being processed.
    """

    leadership_term_id: Int64
    cluster_session_id: Int64
    timestamp: Int64
    payload: bytes


class SessionConnectRequest(Message, tag=3):
    correlation_id: Int64
    response_stream_id: Int32
    version: Int32
    response_channel: str
    encoded_credentials: bytes = b""


class SessionCloseRequest(Message, tag=4):
    leadership_term_id: Int64
    cluster_session_id: Int64


class SessionKeepAlive(Message, tag=5):
    leadership_term_id: Int64
    cluster_session_id: Int64


class ChallengeResponse(Message, tag=8):
    correlation_id: Int64
    cluster_session_id: Int64
    encoded_credentials: bytes = b""


class AdminRequest(Message, tag=26):
    leadership_term_id: Int64
    cluster_session_id: Int64
    correlation_id: Int64
    request_type: AdminRequestType
    payload: bytes = b""


IngressMessage = (
    SessionMessageHeader
    | SessionConnectRequest
    | SessionCloseRequest
    | SessionKeepAlive
    | ChallengeResponse
    | AdminRequest
)
