"""Admission: a client's connect request until its session opens or is turned away.

:class:`SessionAdmission`, held by :class:`~cluster.core.sessions.SessionManager`, keeps
the sessions that are not open yet (Aeron's pending, redirect and rejected sessions):
limits on sessions connecting (in all, and per client address, apart from open ones),
the response channel check, authentication (challenge and response), the REDIRECT of a
member that does not lead, and rejections.  Every answer goes back on the connection the
request came on.  What it needs of the open sessions is :class:`OpenSlots`: a session id,
whether an authenticated session would find a slot, and its opening, all of which the
manager does.

**Fair shares of the pending slots.**  A connect request that nobody answers (a
stranger that never answers its challenge) holds a pending slot until the session
timeout.  A flood of them from a few addresses used to take every slot, and a client
with the right secret was turned away (14 times of 14, from four flooding addresses).
Now, when every slot (``max_pending_sessions``) is taken, a new request takes the place
of the longest-waiting session of the address holding the most slots, provided that
address holds more than the newcomer's (:meth:`SessionAdmission._make_pending_room`);
the one evicted hears ERROR and may ask again.  So each address can keep at most an
equal share while others want slots: flooding from N addresses keeps out nobody who
comes from another, and at most ``max_pending_per_address`` come from any one (an IPv6
address counts by its /64, :func:`~cluster.core.session.address_key`).  Why this and
not only a shorter pending timeout: an attacker re-sends faster than any timeout a
real client's round trip allows, while a share is not a race.  The longest-waiting goes
first because a real client answers its challenge within a round trip and a tick or
two, so among equal shares it is the newest, the last to go.  (An attacker with more
addresses than there are pending slots can still crowd them: raise
``--max-pending-sessions``, or require client certificates, which strangers cannot
pass.)

**Open slots given back.**  When every open slot is taken, a request is still
admitted if an open session may give its slot up (:meth:`OpenSlots.has_room`; the
manager's rule: :meth:`~cluster.core.sessions.SessionManager.admit`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from ..protocol import version as protocol_version
from ..protocol.enums import EventCode
from ..protocol.ingress import ChallengeResponse, SessionConnectRequest
from .auth import Authenticator
from .base import ConsensusConfig, Counters, EgressPort, IngressSource, TermView
from .log import ReplicatedLog
from .notify import SessionNotifier
from .session import (
    ClusterSession,
    PendingSessionProxy,
    State,
    address_key,
    check_channel,
)

log = logging.getLogger("cluster.consensus")


class OpenSlots(Protocol):
    """What admission needs of the open sessions (the session manager's part)."""

    def new_session_id(self) -> int:
        """The next session id (a ready leader's only)."""
        ...

    def has_room(self, now_ns: int) -> bool:
        """Whether an authenticated session would find an open slot now (a free one,
        or one a session without a connection may give back)."""
        ...

    def admit(self, session: ClusterSession, now_ns: int) -> bool:
        """Open an authenticated session; False when no slot is free or given back."""
        ...


class SessionAdmission:
    """Connect requests, authentication, redirects and rejections (see the module):
    the pending, redirect and rejected sessions of one member."""

    def __init__(
        self,
        config: ConsensusConfig,
        egress: EgressPort,
        authenticator: Authenticator,
        log: ReplicatedLog,
        view: TermView,
        counters: Counters,
        notify: SessionNotifier,
        slots: OpenSlots,
    ) -> None:
        self.config = config
        self.egress = egress
        self.authenticator = authenticator
        self.log = log
        self.view = view
        self.counters = counters
        self.notify = notify
        self.slots = slots
        self.pending_sessions: list[ClusterSession] = []
        self.rejected_sessions: list[ClusterSession] = []
        self.redirect_sessions: list[ClusterSession] = []
        self._next_local_egress_id = -1

    def holds(self, source: IngressSource) -> bool:
        """Whether a session not yet open came on the connection ``source``."""
        groups = (self.pending_sessions, self.redirect_sessions, self.rejected_sessions)
        return any(s.source is source for group in groups for s in group)

    def find(self, egress_id: int) -> ClusterSession | None:
        """The session not yet open whose egress is ``egress_id``."""
        for group in (self.pending_sessions, self.redirect_sessions, self.rejected_sessions):
            for candidate in group:
                if candidate.egress_id == egress_id:
                    return candidate
        return None

    def on_source_closed(self, source: IngressSource) -> None:
        """A client's connection closed: the sessions not yet open that came on it are
        dropped."""
        for group in (self.pending_sessions, self.redirect_sessions, self.rejected_sessions):
            for session in [s for s in group if s.source is source]:
                group.remove(session)
                if group is self.pending_sessions:
                    self._leave_pending(session)
                self.egress.close(session.egress_id)  # detaches it, if it was attached
                session.state = State.CLOSED

    def step_down(self) -> None:
        """This leader steps down: its pending sessions are redirected to whoever leads
        next, not left waiting."""
        for session in self.pending_sessions:
            self._leave_pending(session)
        self.redirect_sessions.extend(self.pending_sessions)
        self.pending_sessions.clear()

    def on_connect(
        self, request: SessionConnectRequest, source: IngressSource, now_ns: int
    ) -> None:
        # Only a ready leader assigns session ids: before its log of earlier terms is
        # applied it does not know every id in use.  Until then, redirect (to itself,
        # once ready).
        ready = self.view.is_ready_leader
        if ready:
            session_id = self.slots.new_session_id()
            egress_id = session_id
        else:
            session_id = -1
            egress_id = self._next_local_egress_id
            self._next_local_egress_id -= 1
        session = ClusterSession(
            session_id,
            egress_id,
            request.correlation_id,
            request.response_stream_id,
            request.response_channel,
            now_ns,
        )
        session.source = source
        session.state = State.CONNECTED
        limit = self.config.max_pending_sessions
        if not ready:
            if len(self.redirect_sessions) >= limit:
                self.counters.dropped_connect_requests += 1  # the client asks again
            else:
                self.redirect_sessions.append(session)
            return
        if len(self.rejected_sessions) >= limit:
            self.counters.dropped_connect_requests += 1
            return
        channel_error = check_channel(request.response_channel, source)
        if channel_error:
            session.rejection = (EventCode.ERROR, channel_error)
            self.rejected_sessions.append(session)
        elif not protocol_version.is_compatible(request.version):
            session.rejection = (
                EventCode.ERROR,
                f"invalid client version {protocol_version.to_string(request.version)}, "
                f"cluster is {protocol_version.to_string(protocol_version.PROTOCOL_VERSION)}",
            )
            self.rejected_sessions.append(session)
        elif not self.slots.has_room(now_ns):
            session.rejection = (EventCode.ERROR, "concurrent session limit")
            self.rejected_sessions.append(session)
        elif self._pending_from(address_key(source.address)) >= (
            self.config.max_pending_per_address
        ):
            session.rejection = (
                EventCode.ERROR,
                f"too many sessions connecting from {source.address}, try again",
            )
            self.rejected_sessions.append(session)
        elif len(self.pending_sessions) >= limit and not self._make_pending_room(
            address_key(source.address)
        ):
            session.rejection = (EventCode.ERROR, "too many sessions connecting, try again")
            self.rejected_sessions.append(session)
        else:
            self.authenticator.on_connect_request(
                session_id, request.encoded_credentials, self.log.cluster_time(now_ns)
            )
            if session.own_connection:
                self.egress.attach(egress_id, source)
                session.egress_connected = True
            self.pending_sessions.append(session)

    def _pending_from(self, key: str) -> int:
        return sum(1 for s in self.pending_sessions if s.source and _key(s) == key)

    def _make_pending_room(self, key: str) -> bool:
        """Every pending slot is taken and a request from ``key`` (an
        :func:`~cluster.core.session.address_key`) wants one: the longest-waiting
        session of the address holding the most slots gives its place, if that address
        holds more than ``key`` does (see the module).  Whether a slot was freed."""
        held: dict[str, int] = {}
        oldest: dict[str, ClusterSession] = {}
        for session in self.pending_sessions:
            k = _key(session)
            held[k] = held.get(k, 0) + 1
            first = oldest.get(k)
            if first is None or session.time_of_last_activity_ns < first.time_of_last_activity_ns:
                oldest[k] = session
        if not held:
            return False
        # the most slots; among equals, the one whose oldest has waited longest
        most = max(held, key=lambda k: (held[k], -oldest[k].time_of_last_activity_ns))
        if held[most] <= held.get(key, 0):
            return False
        victim = oldest[most]
        self.pending_sessions.remove(victim)
        self._leave_pending(victim)
        victim.rejection = (
            EventCode.ERROR,
            "too many sessions connecting from your address: this one gave its place "
            "to another address's, try again",
        )
        self._reject(victim)
        self.counters.evicted_pending_sessions += 1
        log.info(
            "pending session %d (from %s) gave its place to a request from %s",
            victim.cluster_session_id,
            most,
            key,
        )
        return True

    def on_challenge_response(
        self, msg: ChallengeResponse, source: IngressSource, now_ns: int
    ) -> None:
        for session in self.pending_sessions:
            if (
                session.cluster_session_id == msg.cluster_session_id
                and session.correlation_id == msg.correlation_id
                and session.state is State.CHALLENGED
                and session.source is source
            ):
                session.time_of_last_activity_ns = now_ns
                self.authenticator.on_challenge_response(
                    session.cluster_session_id,
                    msg.encoded_credentials,
                    self.log.cluster_time(now_ns),
                )
                return
        self.counters.unknown_session_messages += 1

    def send_redirects_and_rejections(self, now_ns: int) -> int:
        work = 0
        view = self.view
        if self.redirect_sessions:
            remaining = []
            for session in self.redirect_sessions:
                if view.leader_member_id < 0 or view.in_election:
                    if now_ns - session.time_of_last_activity_ns > self.config.session_timeout_ns:
                        self.egress.close(session.egress_id)  # no leader emerged in time
                        session.state = State.CLOSED
                        work += 1
                    else:
                        remaining.append(session)  # redirect once a leader is known
                    continue
                self.notify.event(session, EventCode.REDIRECT, self.config.ingress_endpoints)
                self.egress.close(session.egress_id)
                session.state = State.CLOSED
                self.counters.redirected_sessions += 1
                work += 1
            self.redirect_sessions = remaining
        if self.rejected_sessions:
            remaining = []
            for session in self.rejected_sessions:
                self._reject(session)
                work += 1
            self.rejected_sessions = remaining
        return work

    def _reject(self, session: ClusterSession) -> None:
        code, detail = session.rejection or (EventCode.ERROR, "rejected")
        self.notify.event(session, EventCode(code), detail)
        self.egress.close(session.egress_id)
        session.state = State.CLOSED
        self.counters.rejected_sessions += 1

    def process_pending(self, now_ns: int) -> int:
        """Move pending sessions on: connected, authenticated, opened, rejected or
        timed out (a ready leader, every slow tick)."""
        if not self.pending_sessions:
            return 0
        work = 0
        now_ms = self.log.cluster_time(now_ns)
        remaining: list[ClusterSession] = []
        for session in self.pending_sessions:
            if session.state is State.CONNECTED:
                self.authenticator.on_connected_session(
                    PendingSessionProxy(self.egress, session), now_ms
                )
            elif session.state is State.CHALLENGED:
                self.authenticator.on_challenged_session(
                    PendingSessionProxy(self.egress, session), now_ms
                )
            if session.state is State.AUTHENTICATED:
                self._leave_pending(session)
                if not self.slots.admit(session, now_ns):
                    session.rejection = (EventCode.ERROR, "concurrent session limit")
                    self._reject(session)
                work += 1
                continue
            if session.state is State.REJECTED:
                self._leave_pending(session)
                self._reject(session)
                work += 1
                continue
            if now_ns - session.time_of_last_activity_ns > self.config.session_timeout_ns:
                self.counters.timed_out_sessions += 1
                log.info(
                    "pending session %d timed out in %s",
                    session.cluster_session_id,
                    session.state.name,
                )
                self._leave_pending(session)
                self.egress.close(session.egress_id)
                session.state = State.CLOSED
                work += 1
                continue
            remaining.append(session)
        self.pending_sessions = remaining
        return work

    def _leave_pending(self, session: ClusterSession) -> None:
        self.authenticator.on_pending_ended(session.cluster_session_id)


def _key(session: ClusterSession) -> str:
    source = session.source
    return "" if source is None else address_key(source.address)
