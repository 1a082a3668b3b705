"""ClusterSession: the consensus module's view of one client session (seed 000)."""

from __future__ import annotations

import enum
import hashlib
import ipaddress
from typing import Protocol

from ..protocol.egress import Challenge
from ..protocol.enums import CloseReason, EventCode
from ..protocol.ingress import (
    AdminRequest,
    ChallengeResponse,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionResumeRequest,
)
from .base import EgressPort, IngressSource
from .replies import KeptReplies


class State(enum.Enum):
    """Lifecycle of a ClusterSession (Aeron's ``ClusterSession.State``)."""

    INIT = 0
    CONNECTING = 1
    CONNECTED = 2
    CHALLENGED = 3
    AUTHENTICATED = 4
    REJECTED = 5
    OPEN = 6
    CLOSING = 7
    INVALID = 8
    CLOSED = 9


class Action(enum.Enum):
    """Why the session was created (Aeron's ``ClusterSession.Action``)."""

    CLIENT = 0
    BACKUP = 1
    HEARTBEAT = 2
    STANDBY_SNAPSHOT = 3


class ClusterSession:
    """One client session as the consensus module tracks it.

    ``egress_id`` names the session's egress connection in the egress publisher: the
    ``cluster_session_id`` once one is assigned, a negative local id for sessions a
    follower only keeps long enough to redirect.
    """

    __slots__ = (
        "action",
        "close_reason",
        "cluster_session_id",
        "correlation_id",
        "detached_since_ns",
        "egress_backoff_ns",
        "egress_connected",
        "egress_id",
        "egress_retry_ns",
        "egress_up_since_ns",
        "encoded_principal",
        "has_new_leader_event_pending",
        "has_open_event_pending",
        "heartbeat_ns",
        "last_sequence",
        "opened_log_position",
        "rejection",
        "resend_asked_ns",
        "response_channel",
        "response_stream_id",
        "secret",
        "secret_hash",
        "source",
        "state",
        "time_of_last_activity_ns",
    )

    def __init__(
        self,
        cluster_session_id: int,
        egress_id: int,
        correlation_id: int,
        response_stream_id: int,
        response_channel: str,
        now_ns: int,
        action: Action = Action.CLIENT,
    ) -> None:
        self.cluster_session_id = cluster_session_id
        self.egress_id = egress_id
        self.correlation_id = correlation_id
        self.response_stream_id = response_stream_id
        self.response_channel = response_channel
        self.time_of_last_activity_ns = now_ns
        self.action = action
        self.state = State.INIT
        self.close_reason: CloseReason | None = None
        self.opened_log_position = -1
        self.encoded_principal = b""
        self.egress_connected = False
        self.egress_retry_ns: int | None = None  # re-dial a lost egress at this time
        self.egress_backoff_ns = 0  # the last wait before a re-dial (0: none yet)
        self.egress_up_since_ns: int | None = None  # connected since (first seen)
        self.has_open_event_pending = False
        self.has_new_leader_event_pending = False
        self.rejection: tuple[int, str] | None = None  # (EventCode, detail) for a rejected session
        # the connection that holds the session here (None: none does, until a resume)
        self.source: IngressSource | None = None
        self.heartbeat_ns = 0  # next NewLeaderEvent due (egress on the ingress connection)
        # an open session whose connection dropped at this leader: since when it has had
        # none (DROPPED until the next slow tick notes the time; None: it has one, or it
        # was not dropped here, so it gets a whole session timeout to come back)
        self.detached_since_ns: int | None = None
        self.secret = b""  # only on the leader that opened it, until OK is sent
        self.secret_hash = b""  # SHA-256 of the secret, replicated in SessionOpenEvent
        # the highest sequence of the session's messages in this leader's log (set from
        # what the service applied when it becomes ready, then by each append); a
        # follower's is not kept: followers decide nothing
        self.last_sequence = 0
        # when this leader last told the client to resend (a gap; None: never)
        self.resend_asked_ns: int | None = None

    @property
    def own_connection(self) -> bool:
        """Egress goes back on the ingress connection (no response channel to dial)."""
        return not self.response_channel

    def __repr__(self) -> str:
        return (
            f"ClusterSession(id={self.cluster_session_id}, state={self.state.name}, "
            f"channel={self.response_channel!r})"
        )


class SessionProgress(Protocol):
    """What the service's side knows of a session's sequenced messages (the
    container's client session): the highest it applied, the highest its client has
    been told of (a reply or a :class:`~cluster.protocol.egress.SessionAck`), and the
    replies its client has not confirmed (exactly once out)."""

    applied_sequence: int
    told_sequence: int
    replies: KeptReplies


RESEND_AGAIN_NS = 200_000_000
"""A leader that told a client to resend tells it again, at the next gap, only after
this long: its first resend may still be on the way (and a told client that lost the
word keeps sending what the leader drops)."""


CLIENT_REQUESTS = (
    SessionKeepAlive,
    SessionConnectRequest,
    SessionCloseRequest,
    ChallengeResponse,
    SessionResumeRequest,
    AdminRequest,
)
"""Client messages about sessions (their connection is checked)."""

SECRET_BYTES = 16

DROPPED = -1
"""``ClusterSession.detached_since_ns`` of a session whose connection closed since the
last slow tick (which notes the time)."""

EGRESS_HEARTBEAT_NS = 1_000_000_000
"""A leader sends each session whose egress rides its ingress connection a NewLeaderEvent
at least this often: a client hearing nothing for a few of these knows its member no
longer leads (paused, cut off) and looks for the one that does."""


def secret_hash(secret: bytes) -> bytes:
    """What the log keeps of a session's secret."""
    return hashlib.sha256(secret).digest()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def address_key(address: str) -> str:
    """The client address that shares of the pending slots are counted by: the address
    itself, but an IPv6 address's /64 (one host usually has a whole /64 to pick from)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if not ip.is_loopback:
            return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return address


def same_host(channel_host: str, address: str) -> bool:
    """Whether a response channel's host is the address a request came from (any
    loopback address stands for any other: one machine)."""
    if channel_host == address:
        return True
    return _is_loopback(channel_host) and _is_loopback(address)


def check_channel(channel: str, source: IngressSource) -> str:
    """Why a response channel may not be dialled ("" when it may)."""
    if not channel:
        return ""
    host, sep, port = channel.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"bad response channel {channel!r}: expected host:port, or empty"
    if not same_host(host, source.address):
        return (
            f"response channel {channel!r} is not at the address the request came "
            f"from ({source.address}); leave it empty to get egress on this connection"
        )
    return ""


class PendingSessionProxy:
    """The :class:`~cluster.core.auth.SessionProxy` handed to the authenticator."""

    __slots__ = ("_egress", "_session")

    def __init__(self, egress: EgressPort, session: ClusterSession) -> None:
        self._egress = egress
        self._session = session

    @property
    def principal(self) -> str | None:
        """The name on the client's certificate (None without TLS)."""
        source = self._session.source
        return None if source is None else source.principal

    @property
    def session_id(self) -> int:
        return self._session.cluster_session_id

    def challenge(self, encoded_challenge: bytes) -> bool:
        s = self._session
        if s.source is None:
            return False
        sent = self._egress.reply(
            s.source, Challenge(s.correlation_id, s.cluster_session_id, encoded_challenge)
        )
        if sent:
            s.state = State.CHALLENGED
        return sent

    def authenticate(self, encoded_principal: bytes = b"") -> bool:
        # with TLS the name on the client's certificate is its principal: an
        # authenticator may check more, but never names anyone else
        cert = self.principal
        self._session.encoded_principal = encoded_principal if cert is None else cert.encode()
        self._session.state = State.AUTHENTICATED
        return True

    def reject(self) -> None:
        self._session.state = State.REJECTED
        self._session.rejection = (
            EventCode.AUTHENTICATION_REJECTED,
            "session failed authentication",
        )
