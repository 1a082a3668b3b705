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

    ``sequence`` numbers a session's messages 1, 2, 3... on ingress and in the log: the
    leader appends only the session's next one (exactly once, in order; 0: unsequenced,
    as every entry written before protocol 2, appended as it comes).  On egress it is
    the highest sequence of the session the service has applied: the client forgets
    what it kept of those.  A trailing field with a default: logs and snapshots written
    before it still decode.

    ``reply`` numbers the service's replies to a session 1, 2, 3... on egress (exactly
    once out: every member gives the same reply the same number, and the client drops a
    number it has seen; 0: a reply given outside the log, not numbered).  On ingress and
    in the log it is the highest reply the client received in order: every member
    forgets the replies it kept up to it (:mod:`cluster.core.replies`).
    """

    leadership_term_id: Int64
    cluster_session_id: Int64
    timestamp: Int64
    payload: bytes
    sequence: Int64 = 0
    reply: Int64 = 0


class SessionConnectRequest(Message, tag=3):
    """``response_channel`` empty: the cluster's egress for the session comes back on
    this same connection (the default: members dial nobody).  ``host:port``: the
    leader dials it once the session is authenticated (the seeds' response channel);
    ``host`` must be the address the request came from."""

    correlation_id: Int64
    response_stream_id: Int32
    version: Int32
    response_channel: str
    encoded_credentials: bytes = b""


class SessionCloseRequest(Message, tag=4):
    leadership_term_id: Int64
    cluster_session_id: Int64


class SessionKeepAlive(Message, tag=5):
    """``sequence``: the highest sequence of the session's messages the client sent
    before it: a leader whose log holds less asks for the rest again (a client gone
    quiet after messages were dropped on the way is not left waiting)."""

    leadership_term_id: Int64
    cluster_session_id: Int64
    sequence: Int64 = 0


class ChallengeResponse(Message, tag=8):
    correlation_id: Int64
    cluster_session_id: Int64
    encoded_credentials: bytes = b""


class SessionResumeRequest(Message, tag=9):
    """A client's new ingress connection proves it holds an open session (after a
    leader change, or a broken connection): ``session_secret`` is the secret its
    SessionEvent OK carried.  Until it has, the connection may not act for the session.
    A member that does not lead answers REDIRECT; an unknown or closed session, CLOSED.

    ``query_only`` (Triarch's follower reads): the connection asks to carry the
    session's queries only, on any member, leader or follower.  The member checks the
    secret against the session's ``secret_hash`` (every member has it from the log) and
    binds the connection as a *query connection* of the session (answered OK, without
    a secret): it never becomes the session's connection, and the member takes nothing
    but queries from it (:mod:`cluster.core.follower_reads`).
    """

    correlation_id: Int64
    cluster_session_id: Int64
    version: Int32
    session_secret: bytes
    #: the highest of the session's replies the client received in order: the leader
    #: sends what follows (exactly once out)
    reply: Int64 = 0
    #: bind this connection for the session's queries only (see above)
    query_only: bool = False


QUERY_LINEARIZABLE = 0
"""QueryRequest consistency: the leader answers after confirming it still leads (ReadIndex)."""

QUERY_FOLLOWER = 1
"""QueryRequest consistency: any member answers, never older than ``min_position``."""


class QueryRequest(Message, tag=10):
    """A read-only query of the service (Triarch's): answered by the service's
    ``on_query`` with a :class:`~cluster.protocol.egress.QueryResponse` of the same
    ``correlation_id``, without the log.  ``consistency``: :data:`QUERY_LINEARIZABLE` or
    :data:`QUERY_FOLLOWER`; ``min_position``: the highest log position the client has
    seen (a follower read waits until it has applied that far); ``min_sequence``: the
    highest sequence of the session's own messages the client has been told were
    applied (a follower read waits until it has applied them too: the client reads its
    own writes on any member).  A query changes nothing, so a client resends it freely
    (after a leader change, a lost answer, to another member)."""

    leadership_term_id: Int64
    cluster_session_id: Int64
    correlation_id: Int64
    payload: bytes
    consistency: Int32 = QUERY_LINEARIZABLE
    min_position: Int64 = 0
    min_sequence: Int64 = 0


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
    | SessionResumeRequest
    | AdminRequest
    | QueryRequest
)
