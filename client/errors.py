"""Exceptions raised by the cluster client.

Every error the client raises on purpose derives from :class:`ClusterClientError`.
Timeouts also derive from the built-in :class:`TimeoutError`, so
``except TimeoutError`` catches them as it catches :func:`anyio.fail_after`.
"""

from __future__ import annotations

from cluster.protocol.enums import CloseReason
from cluster.transport.tls import TlsError

__all__ = [
    "AuthenticationRejectedError",
    "CertsDirError",
    "ClusterClientError",
    "ConnectTimeoutError",
    "EgressBacklogExceededError",
    "NotConnectedError",
    "ServiceError",
    "SessionClosedError",
    "SessionLostError",
    "SessionRejectedError",
    "TlsRequiredError",
]


class ClusterClientError(Exception):
    """Base class of every error raised by the cluster client."""


class SessionRejectedError(ClusterClientError):
    """The cluster answered the connect request with ``SessionEvent(ERROR)``.

    ``detail`` is the cluster's reason, e.g. ``"concurrent session limit"`` or
    ``"invalid client version ..."``.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(f"session rejected by the cluster: {detail or 'no detail given'}")
        self.detail = detail


class AuthenticationRejectedError(ClusterClientError):
    """The cluster answered with ``SessionEvent(AUTHENTICATION_REJECTED)``."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"authentication rejected by the cluster: {detail or 'no detail given'}")
        self.detail = detail


class SessionClosedError(ClusterClientError):
    """The session is closed; no more messages can be offered or received.

    ``reason`` is the cluster's close reason name when the cluster closed the session
    (``"TIMEOUT"``, ``"SERVICE_ACTION"``, ``"CLIENT_ACTION"``, ``"SHUTDOWN"``,
    ``"ABORT"``: :class:`cluster.protocol.enums.CloseReason`), also when it was closed
    while this client was away and learnt on its resume; ``"CLIENT_ACTION"`` when this
    client closed it; otherwise what happened (``"resumed on another connection"``...).
    ``close_reason`` is the :class:`~cluster.protocol.enums.CloseReason` when ``reason``
    names one, else ``None``.

    ``last_applied`` is the highest sequence number of this session's own messages that
    the service applied (0: none).  A session numbers the messages it accepts 1, 2, 3...
    in the order ``offer``, ``try_offer`` and ``offer_many`` took them: those up to
    ``last_applied`` were applied, once each, and no later one ever will be.  Exact
    when the cluster closed the session (its CLOSED says it); when this client closed
    it, or lost it, the highest the cluster confirmed (later ones may have been applied
    too: a close waits for nothing).
    """

    def __init__(self, reason: str, *, last_applied: int = 0) -> None:
        super().__init__(f"cluster session closed: {reason or 'no reason given'}")
        self.reason = reason
        self.close_reason: CloseReason | None = CloseReason.__members__.get(reason)
        self.last_applied = last_applied


class SessionLostError(SessionClosedError):
    """The session is gone for good on this client's side: no member answered for the
    connect timeout (``reason`` says what each did on its last dial).  The cluster
    closes the session when its session timeout passes."""


class ServiceError(ClusterClientError):
    """The clustered service raised on one of this session's messages.

    Raised by ``receive()`` (and its kin) in the place of that message's reply, in
    order; the session stays open and the next ``receive()`` goes on.  Every member
    raised on the same log entry, so the cluster is consistent: the message was applied
    as far as the service got before it raised.  ``error_type`` is the exception's type
    (``"ValueError"``, ``"mymodule.MyError"``), ``message`` its text, ``log_position``
    where the entry ends in the log, ``timestamp`` its cluster time, and ``request`` the
    message's payload (its first 4,096 bytes), to tell which one it was.
    """

    def __init__(
        self,
        error_type: str,
        message: str,
        log_position: int,
        timestamp: int,
        request: bytes,
        *,
        query: bool = False,
    ) -> None:
        """``query``: raised by ``query()``: the service's ``on_query`` raised (or it
        answers no queries), on the state at ``log_position``; nothing changed."""
        what = "on_query" if query else "on this session's message"
        super().__init__(
            f"the service raised {error_type} {what} (log position {log_position}): {message}"
        )
        self.error_type = error_type
        self.message = message
        self.log_position = log_position
        self.timestamp = timestamp
        self.request = request


class QueryRefusedError(ClusterClientError):
    """The cluster cannot answer a query as asked (``query()``): ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"query refused: {reason}")
        self.reason = reason


class ConnectTimeoutError(ClusterClientError, TimeoutError):
    """No session could be established within ``connect_timeout``."""


class TlsRequiredError(ConnectTimeoutError):
    """Every member dialled requires TLS, and :func:`client.connect` was given no
    ``certs_dir``: raised as soon as each has said so (it answers a TLS hello), without
    waiting for ``connect_timeout``.  A :class:`ConnectTimeoutError`, which is what
    ``connect()`` raised for it before (after the whole timeout).  ``member_ids``: who."""

    def __init__(self, message: str, member_ids: list[int]) -> None:
        super().__init__(message)
        self.member_ids = member_ids


class CertsDirError(ClusterClientError, TlsError):
    """``certs_dir`` is not a usable ``client-<NAME>`` folder: a file is missing or bad,
    it is a member's folder, or its certificate has expired.  Also a
    :class:`cluster.transport.tls.TlsError`, which is what ``connect()`` raised before."""


class NotConnectedError(ClusterClientError):
    """The client has no session (it was never connected or the connect failed)."""


class EgressBacklogExceededError(ClusterClientError):
    """More application egress messages arrived than ``max_egress_backlog`` allows.

    Messages beyond the bound were dropped, so the session's reply stream has a gap;
    every later ``receive()`` raises this error.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"egress backlog exceeded {limit} unreceived messages; later messages were "
            "dropped (call receive() more often or raise max_egress_backlog)"
        )
        self.limit = limit
