"""Admission: a client's connect request until its session opens or is turned away.

:class:`SessionAdmission` is the half of :class:`~cluster.core.sessions.SessionManager`
that handles sessions before they open (Aeron's pending, redirect and rejected
sessions): limits on sessions connecting (in all, and per client address, apart from
open ones), the response channel check, authentication (challenge and response), the
REDIRECT of a member that does not lead, and rejections.  Every answer goes back on the
connection the request came on.  The manager holds the state; this class only groups
the code that works on it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from ..protocol import version as protocol_version
from ..protocol.enums import EventCode
from ..protocol.ingress import ChallengeResponse, SessionConnectRequest
from ..protocol.log import LogMessage
from .auth import Authenticator
from .base import ConsensusConfig, Counters, EgressPort, IngressSource, TermView
from .log import ReplicatedLog
from .session import ClusterSession, PendingSessionProxy, State, check_channel

log = logging.getLogger("cluster.consensus")


class SessionAdmission:
    """Connect requests, authentication, redirects and rejections (see the module)."""

    # the state, owned by SessionManager
    config: ConsensusConfig
    egress: EgressPort
    authenticator: Authenticator
    log: ReplicatedLog
    append: Callable[[LogMessage], int]
    view: TermView
    counters: Counters
    rng: random.Random
    sessions: dict[int, ClusterSession]
    pending_sessions: list[ClusterSession]
    rejected_sessions: list[ClusterSession]
    redirect_sessions: list[ClusterSession]
    next_session_id: int
    _next_local_egress_id: int

    def _open(self, session: ClusterSession, now_ns: int) -> None:
        raise NotImplementedError

    def send_event(
        self, session: ClusterSession, code: EventCode, detail: str, secret: bytes = b""
    ) -> bool:
        raise NotImplementedError

    def on_connect(
        self, request: SessionConnectRequest, source: IngressSource, now_ns: int
    ) -> None:
        # Only a ready leader assigns session ids: before its log of earlier terms is
        # applied it does not know every id in use.  Until then, redirect (to itself,
        # once ready).
        ready = self.view.is_ready_leader
        if ready:
            session_id = self.next_session_id
            self.next_session_id += 1
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
        elif len(self.sessions) >= self.config.max_concurrent_sessions:
            session.rejection = (EventCode.ERROR, "concurrent session limit")
            self.rejected_sessions.append(session)
        elif len(self.pending_sessions) >= limit:
            session.rejection = (EventCode.ERROR, "too many sessions connecting, try again")
            self.rejected_sessions.append(session)
        elif self._pending_from(source.address) >= self.config.max_pending_per_address:
            session.rejection = (
                EventCode.ERROR,
                f"too many sessions connecting from {source.address}, try again",
            )
            self.rejected_sessions.append(session)
        else:
            self.authenticator.on_connect_request(
                session_id, request.encoded_credentials, self.log.cluster_time(now_ns)
            )
            if session.own_connection:
                self.egress.attach(egress_id, source)
                session.egress_connected = True
            self.pending_sessions.append(session)

    def _pending_from(self, address: str) -> int:
        return sum(1 for s in self.pending_sessions if s.source and s.source.address == address)

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
                self.send_event(session, EventCode.REDIRECT, self.config.ingress_endpoints)
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
        self.send_event(session, EventCode(code), detail)
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
                if len(self.sessions) >= self.config.max_concurrent_sessions:
                    session.rejection = (EventCode.ERROR, "concurrent session limit")
                    self._reject(session)
                else:
                    self._open(session, now_ns)
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
