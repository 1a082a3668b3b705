"""The connect handshake as a sans-IO state machine (Aeron's ``AsyncConnect``).

No sockets and no clock of its own: the I/O shell (:mod:`client._handshake`) feeds events
in (and, to have silent members worked around, a clock) and carries out the actions that
come back.  The sequence, as in Aeron::

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

Responses are matched on the correlation id of a ``SessionConnectRequest`` in flight
(the ``ChallengeResponse`` carries that same id, as the cluster expects); anything else
is ignored.  A ``REDIRECT`` starts a new request, with a new correlation id, so late
answers to the old one are ignored too.

**A member that does not answer.**  A paused member (SIGSTOP, a machine swapping) still
completes TCP connections, for its kernel accepts them, but answers nothing.  Given a
``clock``, the machine does not wait on it: once every request in flight has gone
unanswered (no Challenge, OK, REDIRECT, ERROR...) for :data:`ANSWER_TIMEOUT` seconds
after its last message was written, the request also goes to every other member
(:class:`ConnectEach`), each on a connection of its own with a correlation id of its own;
the silent one stays in flight, for it may still answer first.  A member that answers
within the timeout costs nothing more: no other member is asked.  An *attempt* is one
request on one connection; at most one is in flight per member, and:

- the first OK wins (:class:`Done`): the shell closes every other connection;
- a REDIRECT ends its attempt only (:class:`DropIngress`); the leader it names is asked
  unless an attempt at it is already in flight (so a leader gets one request at a time);
- ERROR, AUTHENTICATION_REJECTED or CLOSED from any attempt ends the connect
  (:class:`Fail`);
- an attempt whose connection is lost just ends; when none is left, the connect starts
  over as before (:class:`ConnectIngress`);
- while every attempt in flight is overdue, members are asked again (followers that
  named the silent leader, say), each no sooner than :data:`ANSWER_TIMEOUT` after it was
  last asked, the wait doubling per ask up to :data:`ASK_AGAIN_CAP`: a frozen leader
  means no leader until an election, and the connect waits for the new one.

A frozen follower thus costs a connect at most :data:`ANSWER_TIMEOUT` and a round trip.

**One session.**  Only a ready leader opens a session, and it sends OK only once the
session's open event is committed.  A member never holds two of this client's requests,
so a second session could only be opened by a second leader: one that was deposed while
it held a request (a frozen leader and its successor).  The first OK ends the handshake
(any later answer is ignored, whatever connection it comes on) and the shell closes every
other connection at once; a member drops a request whose connection closed before its
session opened, and a session that opened all the same is never told OK (its connection
is gone) and closes with the session timeout, never seen by the application.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from cluster.protocol.egress import Challenge, SessionEvent
from cluster.protocol.enums import EventCode
from cluster.protocol.ingress import ChallengeResponse, SessionConnectRequest
from cluster.protocol.version import PROTOCOL_VERSION

from ._credentials import CredentialsSupplier
from ._endpoints import Endpoint, merge_endpoints, parse_endpoints
from .errors import (
    AuthenticationRejectedError,
    ClusterClientError,
    SessionClosedError,
    SessionRejectedError,
)

__all__ = [
    "ANSWER_TIMEOUT",
    "ASK_AGAIN_CAP",
    "Action",
    "AsyncConnect",
    "ConnectEach",
    "ConnectIngress",
    "ConnectResult",
    "ConnectState",
    "Done",
    "DropIngress",
    "Fail",
    "SendMessage",
]

ANSWER_TIMEOUT = 0.5
"""Seconds a member has to answer a connect request or challenge response (with a
Challenge, OK, REDIRECT, ERROR...) before the request also goes to every other member.
A healthy cluster answers in milliseconds (the OK waits for one commit); a member that
is paused still accepts TCP connections but answers nothing."""
ASK_AGAIN_CAP = 2.0
"""While every request in flight is overdue, a member is asked again after
:data:`ANSWER_TIMEOUT`, then twice that, and so on up to this many seconds."""


class ConnectState(enum.Enum):
    """States of :class:`AsyncConnect`, named as in Aeron's ``AsyncConnect.State``."""

    CREATE_EGRESS_SUBSCRIPTION = enum.auto()
    CREATE_INGRESS_PUBLICATIONS = enum.auto()
    AWAIT_PUBLICATION_CONNECTED = enum.auto()
    SEND_MESSAGE = enum.auto()
    POLL_RESPONSE = enum.auto()
    CONCLUDE_CONNECT = enum.auto()
    DONE = enum.auto()


_ACTIVE = (
    ConnectState.AWAIT_PUBLICATION_CONNECTED,
    ConnectState.SEND_MESSAGE,
    ConnectState.POLL_RESPONSE,
)


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
class ConnectEach:
    """Also connect to each of these members, keeping every connection held: each one
    reported with :meth:`AsyncConnect.on_ingress_connected` gets a request of its own.
    Keep retrying members that refuse, until :attr:`AsyncConnect.dialling` leaves them out."""

    members: Mapping[int, Endpoint]


@dataclass(frozen=True, slots=True)
class DropIngress:
    """The attempt on the ingress connection to ``member_id`` is over: close it."""

    member_id: int


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


Action = ConnectIngress | ConnectEach | DropIngress | SendMessage | Done | Fail


@dataclass(slots=True)
class _Pending:
    """A request in flight: who it went to and the correlation id answers must carry."""

    member_id: int
    correlation_id: int
    sent: bool = False  # the last message for it was written (on_sent)
    due: float = math.inf  # when, unanswered, it is overdue (once sent, with a clock)
    overdue: bool = False


class AsyncConnect:
    """Drives one connect from egress bound to session open (or refused).

    ``endpoints`` maps member ids to ingress endpoints; ``next_correlation_id`` returns a
    fresh correlation id per call.  Events that do not fit the current state (a late
    ingress connection, a message for another request) are ignored and return no action;
    calling :meth:`on_egress_bound` twice is a programming error (:class:`RuntimeError`).

    With a ``clock`` (seconds, monotonic), a request unanswered for ``answer_timeout``
    seconds also goes to the other members (see the module docstring): the shell calls
    :meth:`on_timer` once ``clock()`` reaches :attr:`deadline`.  Without one, the machine
    waits on the one request in flight, as Aeron's does.
    """

    def __init__(
        self,
        endpoints: Mapping[int, Endpoint],
        credentials: CredentialsSupplier,
        next_correlation_id: Callable[[], int],
        response_channel: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        answer_timeout: float = ANSWER_TIMEOUT,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one ingress endpoint is needed")
        if answer_timeout <= 0:
            raise ValueError(f"answer_timeout must be positive, got {answer_timeout!r}")
        self._given: dict[int, Endpoint] = dict(endpoints)
        """What the application gave: those win over what members advertise."""
        self._endpoints: dict[int, Endpoint] = dict(endpoints)
        self._targets: dict[int, Endpoint] = dict(endpoints)
        self._credentials = credentials
        self._next_correlation_id = next_correlation_id
        self._response_channel = response_channel
        self._clock = clock
        self._answer_timeout = answer_timeout
        self._phase = ConnectState.CREATE_EGRESS_SUBSCRIPTION
        self._attempts: dict[int, _Pending] = {}  # member id -> its request in flight
        self._dialling: dict[int, Endpoint] = {}  # members a connection is wanted to
        self._race = True  # any one of ``_dialling`` will do (ConnectIngress)
        self._asked: dict[int, tuple[int, float]] = {}  # member -> (requests, last one at)
        self._last_send: int | None = None  # member of the last SendMessage
        self._result: ConnectResult | None = None
        self._error: ClusterClientError | None = None

    # ------------------------------------------------------------------ inspection

    @property
    def state(self) -> ConnectState:
        """Current state: with several attempts in flight, ``SEND_MESSAGE`` while one
        has a message to send, else ``POLL_RESPONSE``."""
        if self._phase not in _ACTIVE:
            return self._phase
        attempts = self._attempts.values()
        if any(not a.sent for a in attempts):
            return ConnectState.SEND_MESSAGE
        return ConnectState.POLL_RESPONSE if attempts else ConnectState.AWAIT_PUBLICATION_CONNECTED

    @property
    def endpoints(self) -> dict[int, Endpoint]:
        """Ingress endpoints as last learned (a REDIRECT may update them)."""
        return dict(self._endpoints)

    @property
    def targets(self) -> dict[int, Endpoint]:
        """Members a fresh start connects to (all of them, or the leader after a REDIRECT)."""
        return dict(self._targets)

    @property
    def dialling(self) -> dict[int, Endpoint]:
        """Members a connection is still wanted to (connectors to others may stop)."""
        return dict(self._dialling) if self._phase in _ACTIVE else {}

    @property
    def attempts(self) -> dict[int, int]:
        """Requests in flight: member id -> correlation id, oldest first."""
        return {m: a.correlation_id for m, a in self._attempts.items()}

    @property
    def correlation_id(self) -> int | None:
        """Correlation id of the oldest connect request in flight, if any."""
        first = self._first()
        return None if first is None else first.correlation_id

    @property
    def member_id(self) -> int | None:
        """Member whose ingress connection carries the oldest request in flight (the
        winner's, once OK came), if any."""
        first = self._first()
        return None if first is None else first.member_id

    @property
    def result(self) -> ConnectResult | None:
        """The granted session, once OK was received."""
        return self._result

    @property
    def error(self) -> ClusterClientError | None:
        """Why the connect failed, once it has."""
        return self._error

    @property
    def deadline(self) -> float | None:
        """When (on ``clock``) :meth:`on_timer` next has something to do; ``None`` while
        there is nothing to time (no clock, no request in flight, a message not yet
        written, every member asked).  Any event may change it."""
        if self._clock is None or self._phase not in _ACTIVE or not self._attempts:
            return None
        waiting = [a for a in self._attempts.values() if not a.overdue]
        if waiting:
            due = min(a.due for a in waiting)
            return None if due == math.inf else due
        times = [self._ask_at(m) for m in self._endpoints if self._may_ask(m)]
        return min(times, default=None)

    # ------------------------------------------------------------------ events

    def on_egress_bound(self, response_channel: str | None = None) -> list[Action]:
        """The egress listener is up at ``response_channel`` (``"host:port"``), or ``""``:
        the cluster sends egress back on the ingress connection.

        Returns ``[ConnectIngress(all members)]``.
        """
        if self._phase is not ConnectState.CREATE_EGRESS_SUBSCRIPTION:
            raise RuntimeError(f"on_egress_bound() in state {self._phase.name}")
        if response_channel is not None:
            self._response_channel = response_channel
        if self._response_channel is None:
            raise ValueError("a response channel is needed ('' for egress on ingress)")
        self._phase = ConnectState.CREATE_INGRESS_PUBLICATIONS
        return self._connect_to(self._endpoints)

    def on_ingress_connected(self, member_id: int) -> list[Action]:
        """An ingress connection to ``member_id`` is up.

        One to a member being dialled gets a ``SessionConnectRequest`` (after a
        :class:`ConnectIngress` only the first one does); any other is ignored (returns
        ``[]``) and should be closed by the caller.
        """
        if self._phase not in _ACTIVE:
            return []
        if member_id not in self._dialling or member_id in self._attempts:
            return []
        if self._race:
            self._dialling.clear()
        else:
            del self._dialling[member_id]
        assert self._response_channel is not None
        correlation_id = self._next_correlation_id()
        request = SessionConnectRequest(
            correlation_id=correlation_id,
            response_stream_id=0,
            version=PROTOCOL_VERSION,
            response_channel=self._response_channel,
            encoded_credentials=bytes(self._credentials.encoded_credentials()),
        )
        self._attempts[member_id] = _Pending(member_id, correlation_id)
        if self._clock is not None:
            count, _ = self._asked.get(member_id, (0, 0.0))
            self._asked[member_id] = (count + 1, self._clock())
        return [self._send(member_id, request)]

    def on_sent(self, member_id: int | None = None) -> list[Action]:
        """The :class:`SendMessage` to ``member_id`` (default: the last one) was written;
        wait for the answer (with a clock: for up to ``answer_timeout`` seconds)."""
        if member_id is None:
            member_id = self._last_send
        attempt = self._attempts.get(member_id) if member_id is not None else None
        if attempt is not None and not attempt.sent and self._phase in _ACTIVE:
            attempt.sent = True
            if self._clock is not None:
                attempt.due = self._clock() + self._answer_timeout
        return []

    def on_ingress_lost(self, member_id: int) -> list[Action]:
        """The ingress connection to ``member_id`` broke (or a send on it failed).

        If it carried the last request in flight, start over on the current targets;
        other attempts in flight carry on.
        """
        if self._phase not in _ACTIVE or self._attempts.pop(member_id, None) is None:
            return []
        if self._attempts:
            return []
        return self._connect_to(self._targets)

    def on_egress_message(self, message: Any) -> list[Action]:
        """A message arrived on any egress connection.

        Only a :class:`Challenge` or :class:`SessionEvent` carrying the correlation id of
        a request in flight is acted upon; everything else returns ``[]``.
        """
        if self._phase not in _ACTIVE or not isinstance(message, Challenge | SessionEvent):
            return []
        for attempt in self._attempts.values():
            if attempt.correlation_id == message.correlation_id:
                break
        else:
            return []
        if isinstance(message, Challenge):
            return self._on_challenge(attempt, message)
        return self._on_session_event(attempt, message)

    def on_timer(self) -> list[Action]:
        """``clock()`` reached :attr:`deadline` (calling it early or twice is harmless):
        requests unanswered for ``answer_timeout`` are overdue, and while every one in
        flight is, the members with none are asked too (:class:`ConnectEach`)."""
        if self._clock is None or self._phase not in _ACTIVE or not self._attempts:
            return []
        now = self._clock()
        for attempt in self._attempts.values():
            if attempt.due <= now:
                attempt.overdue = True
        if not all(a.overdue for a in self._attempts.values()):
            return []
        members = {
            m: e for m, e in self._endpoints.items() if self._may_ask(m) and self._ask_at(m) <= now
        }
        if not members:
            return []
        self._race = False
        self._dialling.update(members)
        return [ConnectEach(members)]

    def on_concluded(self) -> None:
        """The shell has built the client from the result: the handshake is over."""
        if self._phase is ConnectState.CONCLUDE_CONNECT:
            self._phase = ConnectState.DONE

    # ------------------------------------------------------------------ internals

    def _first(self) -> _Pending | None:
        return next(iter(self._attempts.values()), None)

    def _may_ask(self, member_id: int) -> bool:
        return member_id not in self._attempts and member_id not in self._dialling

    def _ask_at(self, member_id: int) -> float:
        """When ``member_id`` may be asked (again) while every request is overdue."""
        count, last = self._asked.get(member_id, (0, 0.0))
        if count == 0:
            return -math.inf
        return last + min(ASK_AGAIN_CAP, self._answer_timeout * 2.0 ** min(count - 1, 32))

    def _send(self, member_id: int, message: SessionConnectRequest | ChallengeResponse) -> Action:
        attempt = self._attempts[member_id]
        attempt.sent = False
        attempt.due = math.inf
        attempt.overdue = False
        self._last_send = member_id
        return SendMessage(member_id, message)

    def _connect_to(self, members: Mapping[int, Endpoint]) -> list[Action]:
        self._targets = dict(members)
        self._dialling = dict(members)
        self._race = True
        self._phase = ConnectState.AWAIT_PUBLICATION_CONNECTED
        return [ConnectIngress(dict(members))]

    def _on_challenge(self, attempt: _Pending, challenge: Challenge) -> list[Action]:
        answer = self._credentials.on_challenge(bytes(challenge.encoded_challenge))
        response = ChallengeResponse(
            correlation_id=attempt.correlation_id,
            cluster_session_id=challenge.cluster_session_id,
            encoded_credentials=bytes(answer),
        )
        return [self._send(attempt.member_id, response)]

    def _on_session_event(self, attempt: _Pending, event: SessionEvent) -> list[Action]:
        code = event.code
        if code is EventCode.OK:
            self._result = ConnectResult(
                cluster_session_id=event.cluster_session_id,
                leadership_term_id=event.leadership_term_id,
                leader_member_id=event.leader_member_id,
                member_id=attempt.member_id,
                endpoints=dict(self._endpoints),
                session_secret=bytes(event.session_secret),
            )
            self._attempts = {attempt.member_id: attempt}
            self._dialling.clear()
            self._phase = ConnectState.CONCLUDE_CONNECT
            return [Done(self._result)]
        if code is EventCode.REDIRECT:
            return self._on_redirect(attempt, event)
        error: ClusterClientError
        if code is EventCode.AUTHENTICATION_REJECTED:
            error = AuthenticationRejectedError(event.detail)
        elif code is EventCode.CLOSED:
            error = SessionClosedError(event.detail)
        else:
            error = SessionRejectedError(event.detail)
        self._error = error
        self._attempts.clear()
        self._dialling.clear()
        self._phase = ConnectState.DONE
        return [Fail(error)]

    def _on_redirect(self, attempt: _Pending, event: SessionEvent) -> list[Action]:
        if event.detail:
            with suppress(ValueError):  # keep what we knew; the leader may be in it
                self._endpoints = merge_endpoints(self._given, parse_endpoints(event.detail))
        del self._attempts[attempt.member_id]
        leader_id = event.leader_member_id
        leader = self._endpoints.get(leader_id)
        # The leader is not among the known endpoints: try everyone again.
        members = {leader_id: leader} if leader is not None else dict(self._endpoints)
        if not self._attempts:
            return self._connect_to(members)
        # Other attempts are in flight (a member that did not answer in time): keep them,
        # and ask the leader unless it has a request of this client's already.  (A leader
        # unknown here is left to the timer, which asks the others in their turn.)
        self._targets = dict(members)
        actions: list[Action] = [DropIngress(attempt.member_id)]
        if leader is not None and self._may_ask(leader_id):
            self._race = False  # (no race is on: the first connection ended it)
            self._dialling[leader_id] = leader
            actions.append(ConnectEach({leader_id: leader}))
        return actions
