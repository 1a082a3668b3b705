"""Egress channel: cluster -> client (Aeron template ids 1, 2, 6, 7, 27; Triarch's own 28-31)."""

from __future__ import annotations

from .._typing import Int32, Int64
from ._base import Message
from .enums import AdminRequestType, AdminResponseCode, EventCode, QueryStatus
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
    #: with CLOSED: the highest sequence of the session's own messages that the service
    #: applied (0: none); every later one was not, and never will be
    last_applied: Int64 = 0


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


SERVICE_ERROR_REQUEST_BYTES = 4096
"""At most this many bytes of the message the service raised on go back in a
:class:`ServiceErrorEvent` (its ``request``), so the sender can tell which one it was."""


class ServiceErrorEvent(Message, tag=28):
    """The clustered service raised on a message of this session (Triarch's: Aeron hands
    the error to the service's error handler only).  Every member raised on the same log
    entry, which ends at ``log_position``; the leader tells the sender, whose
    ``receive()`` raises :class:`client.ServiceError`.  The session stays open."""

    cluster_session_id: Int64
    leadership_term_id: Int64
    log_position: Int64
    timestamp: Int64
    error_type: str
    message: str
    #: the message's payload, cut to :data:`SERVICE_ERROR_REQUEST_BYTES`
    request: bytes = b""
    #: its number among the session's replies (exactly once out: see
    #: :class:`~cluster.protocol.ingress.SessionMessageHeader`)
    reply: Int64 = 0


class RepliesDropped(Message, tag=29):
    """Replies to this session were dropped: ``count`` since the last such event
    (Triarch's: Aeron's egress drops them without a word).  Members of protocol 2 no
    longer send it: they keep a session's replies until its client confirms them and
    number them, so a client sees a gap itself (past ``--max-kept-replies`` the oldest
    go); it still decodes, and a client still counts it."""

    cluster_session_id: Int64
    leadership_term_id: Int64
    count: Int64


class SessionAck(Message, tag=30):
    """What the cluster holds of the session's sequenced messages (Triarch's: exactly
    once in, issue 42).  ``applied``: the highest sequence the service has applied
    (committed: the client forgets what it kept up to it); ``logged``: the highest in
    the leader's log.  ``resend``: the leader wants what follows ``logged`` again at
    once: it took a resume (or became the session's leader), or it dropped a message
    that was not the session's next (what came before it was lost on the way)."""

    cluster_session_id: Int64
    leadership_term_id: Int64
    applied: Int64
    logged: Int64
    resend: bool = False


class QueryResponse(Message, tag=31):
    """The answer to the :class:`~cluster.protocol.ingress.QueryRequest` of
    ``correlation_id`` (Triarch's).  ``status`` OK: ``payload`` is what the service's
    ``on_query`` returned, from its state at ``log_position`` (the log it had applied).
    SERVICE_ERROR: ``on_query`` raised (``error_type``, ``message``), or the service
    answers no queries.  NOT_LEADER: ask the leader (``leader_member_id``, -1 while
    none is known); BUSY: too many queries in flight, try again later; REFUSED: not
    answerable as asked (``message`` says why)."""

    cluster_session_id: Int64
    correlation_id: Int64
    leadership_term_id: Int64
    status: QueryStatus
    log_position: Int64
    payload: bytes = b""
    error_type: str = ""
    message: str = ""
    leader_member_id: Int32 = -1


EgressMessage = (
    SessionMessageHeader
    | SessionEvent
    | NewLeaderEvent
    | Challenge
    | AdminResponse
    | ServiceErrorEvent
    | RepliesDropped
    | SessionAck
    | QueryResponse
)
