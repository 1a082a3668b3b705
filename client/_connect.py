"""The connect handshake as a sans-IO state machine (Aeron's ``AsyncConnect``).

No sockets, no clocks, no async: the I/O shell (:mod:`client._handshake`) feeds events in
and carries out the actions that come back.  The sequence, as in Aeron::

    CREATE_EGRESS_SUBSCRIPTION  --on_egress_bound(channel)-->        (ConnectIngress)
    CREATE_INGRESS_PUBLICATIONS (passed through at once)
    AWAIT_PUBLICATION_CONNECTED --on_ingress_connected(member)-->    (SendMessage connect request)
    SEND_MESSAGE                --on_sent()-->
    POLL_RESPONSE               --on_egress_message(msg)-->
        Challenge                -> SEND_MESSAGE    (SendMessage ChallengeResponse)
        SessionEvent OK          -> CONCLUDE_CONNECT (Done)
        SessionEvent REDIRECT    -> AWAIT_PUBLICATION_CONNECTED (ConnectIngress to the leader)
        ERROR / AUTH_REJECTED    -> DONE            (Fail)
    CONCLUDE_CONNECT            --on_concluded()-->  DONE

Responses are matched on the correlation id of the current ``SessionConnectRequest``
(the ``ChallengeResponse`` carries that same id, as the cluster expects); anything else
is ignored.  A ``REDIRECT`` starts a new request, with a new correlation id, so late
answers to the old one are ignored too.  Timeouts are the shell's business.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from cluster.protocol.egress import Challenge, SessionEvent
from cluster.protocol.enums import EventCode
from cluster.protocol.ingress import ChallengeResponse, SessionConnectRequest
from cluster.protocol.version import PROTOCOL_VERSION

from ._credentials import CredentialsSupplier
from ._endpoints import Endpoint, parse_endpoints
from .errors import (
    AuthenticationRejectedError,
    ClusterClientError,
    SessionClosedError,
    SessionRejectedError,
)

__all__ = [
    "Action",
    "AsyncConnect",
    "ConnectIngress",
    "ConnectResult",
    "ConnectState",
    "Done",
    "Fail",
    "SendMessage",
]


class ConnectState(enum.Enum):
    """States of :class:`AsyncConnect`, named as in Aeron's ``AsyncConnect.State``."""

    CREATE_EGRESS_SUBSCRIPTION = enum.auto()
    CREATE_INGRESS_PUBLICATIONS = enum.auto()
    AWAIT_PUBLICATION_CONNECTED = enum.auto()
    SEND_MESSAGE = enum.auto()
    POLL_RESPONSE = enum.auto()
    CONCLUDE_CONNECT = enum.auto()
    DONE = enum.auto()


@dataclass(frozen=True, slots=True)
class ConnectResult:
    """What the cluster granted: the session, and where its leader is."""

    cluster_session_id: int
    leadership_term_id: int
    leader_member_id: int
    member_id: int
    """Member whose ingress connection carried the handshake (the leader)."""
    endpoints: dict[int, Endpoint]
    """Ingress endpoints as last learned (from a REDIRECT, or as given)."""
    session_secret: bytes = b""
    """Proves the session on another connection (a SessionResumeRequest)."""


@dataclass(frozen=True, slots=True)
class ConnectIngress:
    """Drop every ingress connection held and connect to these members.

    Any one of them is enough; report each connection that succeeds with
    :meth:`AsyncConnect.on_ingress_connected` (the first one is used, later ones are
    ignored and should be closed).  Keep retrying members that refuse.
    """

    members: Mapping[int, Endpoint]


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Send ``message`` on the ingress connection to ``member_id``, then call ``on_sent``."""

    member_id: int
    message: SessionConnectRequest | ChallengeResponse


@dataclass(frozen=True, slots=True)
class Done:
    """The session is open; keep the ingress connection to ``result.member_id`` only."""

    result: ConnectResult


@dataclass(frozen=True, slots=True)
class Fail:
    """The cluster refused the session; raise ``error``."""

    error: ClusterClientError


Action = ConnectIngress | SendMessage | Done | Fail


@dataclass(slots=True)
class _Pending:
    """The request in flight: who it went to and the correlation id answers must carry."""

    member_id: int
    correlation_id: int


class AsyncConnect:
    """Drives one connect attempt from egress bound to session open (or refused).

    ``endpoints`` maps member ids to ingress endpoints; ``next_correlation_id`` returns a
    fresh correlation id per call.  Events that do not fit the current state (a late
    ingress connection, a message for another request) are ignored and return no action;
    calling :meth:`on_egress_bound` twice is a programming error (:class:`RuntimeError`).
    """

    def __init__(
        self,
        endpoints: Mapping[int, Endpoint],
        credentials: CredentialsSupplier,
        next_correlation_id: Callable[[], int],
        response_channel: str | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one ingress endpoint is needed")
        self._endpoints: dict[int, Endpoint] = dict(endpoints)
        self._targets: dict[int, Endpoint] = dict(endpoints)
        self._credentials = credentials
        self._next_correlation_id = next_correlation_id
        self._response_channel = response_channel
        self._state = ConnectState.CREATE_EGRESS_SUBSCRIPTION
        self._pending: _Pending | None = None
        self._result: ConnectResult | None = None
        self._error: ClusterClientError | None = None

    # ------------------------------------------------------------------ inspection

    @property
    def state(self) -> ConnectState:
        """Current state."""
        return self._state

    @property
    def endpoints(self) -> dict[int, Endpoint]:
        """Ingress endpoints as last learned (a REDIRECT may update them)."""
        return dict(self._endpoints)

    @property
    def targets(self) -> dict[int, Endpoint]:
        """Members currently being connected to (all of them, or the leader after a REDIRECT)."""
        return dict(self._targets)

    @property
    def correlation_id(self) -> int | None:
        """Correlation id of the connect request in flight, if any."""
        return None if self._pending is None else self._pending.correlation_id

    @property
    def member_id(self) -> int | None:
        """Member whose ingress connection carries the handshake, if chosen yet."""
        return None if self._pending is None else self._pending.member_id

    @property
    def result(self) -> ConnectResult | None:
        """The granted session, once OK was received."""
        return self._result

    @property
    def error(self) -> ClusterClientError | None:
        """Why the connect failed, once it has."""
        return self._error

    # ------------------------------------------------------------------ events

    def on_egress_bound(self, response_channel: str | None = None) -> list[Action]:
        """The egress listener is up at ``response_channel`` (``"host:port"``), or ``""``:
        the cluster sends egress back on the ingress connection.

        Returns ``[ConnectIngress(all members)]``.
        """
        if self._state is not ConnectState.CREATE_EGRESS_SUBSCRIPTION:
            raise RuntimeError(f"on_egress_bound() in state {self._state.name}")
        if response_channel is not None:
            self._response_channel = response_channel
        if self._response_channel is None:
            raise ValueError("a response channel is needed ('' for egress on ingress)")
        self._state = ConnectState.CREATE_INGRESS_PUBLICATIONS
        return self._connect_to(self._endpoints)

    def on_ingress_connected(self, member_id: int) -> list[Action]:
        """An ingress connection to ``member_id`` is up.

        The first one while awaiting a connection gets the ``SessionConnectRequest``;
        any other is ignored (returns ``[]``) and should be closed by the caller.
        """
        if self._state is not ConnectState.AWAIT_PUBLICATION_CONNECTED:
            return []
        if member_id not in self._targets:
            return []
        assert self._response_channel is not None
        correlation_id = self._next_correlation_id()
        request = SessionConnectRequest(
            correlation_id=correlation_id,
            response_stream_id=0,
            version=PROTOCOL_VERSION,
            response_channel=self._response_channel,
            encoded_credentials=bytes(self._credentials.encoded_credentials()),
        )
        self._pending = _Pending(member_id, correlation_id)
        self._state = ConnectState.SEND_MESSAGE
        return [SendMessage(member_id, request)]

    def on_sent(self) -> list[Action]:
        """The last :class:`SendMessage` was written; start polling for the response."""
        if self._state is ConnectState.SEND_MESSAGE:
            self._state = ConnectState.POLL_RESPONSE
        return []

    def on_ingress_lost(self, member_id: int) -> list[Action]:
        """The ingress connection to ``member_id`` broke (or a send on it failed).

        If it carried the handshake, start over on the current targets.
        """
        if (
            self._state in (ConnectState.SEND_MESSAGE, ConnectState.POLL_RESPONSE)
            and self._pending is not None
            and self._pending.member_id == member_id
        ):
            self._pending = None
            return self._connect_to(self._targets)
        return []

    def on_egress_message(self, message: Any) -> list[Action]:
        """A message arrived on any egress connection.

        Only a :class:`Challenge` or :class:`SessionEvent` carrying the correlation id of
        the request in flight is acted upon; everything else returns ``[]``.
        """
        pending = self._pending
        if pending is None or self._state not in (
            ConnectState.SEND_MESSAGE,
            ConnectState.POLL_RESPONSE,
        ):
            return []
        if isinstance(message, Challenge):
            if message.correlation_id != pending.correlation_id:
                return []
            return self._on_challenge(pending, message)
        if isinstance(message, SessionEvent):
            if message.correlation_id != pending.correlation_id:
                return []
            return self._on_session_event(pending, message)
        return []

    def on_concluded(self) -> None:
        """The shell has built the client from the result: the handshake is over."""
        if self._state is ConnectState.CONCLUDE_CONNECT:
            self._state = ConnectState.DONE

    # ------------------------------------------------------------------ internals

    def _connect_to(self, members: Mapping[int, Endpoint]) -> list[Action]:
        self._targets = dict(members)
        self._state = ConnectState.AWAIT_PUBLICATION_CONNECTED
        return [ConnectIngress(dict(members))]

    def _on_challenge(self, pending: _Pending, challenge: Challenge) -> list[Action]:
        answer = self._credentials.on_challenge(bytes(challenge.encoded_challenge))
        response = ChallengeResponse(
            correlation_id=pending.correlation_id,
            cluster_session_id=challenge.cluster_session_id,
            encoded_credentials=bytes(answer),
        )
        self._state = ConnectState.SEND_MESSAGE
        return [SendMessage(pending.member_id, response)]

    def _on_session_event(self, pending: _Pending, event: SessionEvent) -> list[Action]:
        code = event.code
        if code is EventCode.OK:
            self._result = ConnectResult(
                cluster_session_id=event.cluster_session_id,
                leadership_term_id=event.leadership_term_id,
                leader_member_id=event.leader_member_id,
                member_id=pending.member_id,
                endpoints=dict(self._endpoints),
                session_secret=bytes(event.session_secret),
            )
            self._state = ConnectState.CONCLUDE_CONNECT
            return [Done(self._result)]
        if code is EventCode.REDIRECT:
            return self._on_redirect(event)
        error: ClusterClientError
        if code is EventCode.AUTHENTICATION_REJECTED:
            error = AuthenticationRejectedError(event.detail)
        elif code is EventCode.CLOSED:
            error = SessionClosedError(event.detail)
        else:
            error = SessionRejectedError(event.detail)
        self._error = error
        self._pending = None
        self._state = ConnectState.DONE
        return [Fail(error)]

    def _on_redirect(self, event: SessionEvent) -> list[Action]:
        if event.detail:
            with suppress(ValueError):  # keep what we knew; the leader may be in it
                self._endpoints = parse_endpoints(event.detail)
        self._pending = None
        leader = self._endpoints.get(event.leader_member_id)
        if leader is None:
            # The leader is not among the known endpoints: try everyone again.
            return self._connect_to(self._endpoints)
        return self._connect_to({event.leader_member_id: leader})
