"""The consensus module's session and log work, sans-IO (seeds 000, 002, 003).

:class:`ConsensusModule` owns the ClusterSessions, sequences ingress into the log and
decides the commit position.  It performs no I/O: time arrives as ``now_ns`` arguments
(a monotonic clock in nanoseconds), log records accumulate in :attr:`log_buffer` for the
shell to hand to the archive, and egress goes out through an :class:`EgressPort` whose
methods only enqueue.  The Trio agents (``cluster.agents``) and the deterministic
simulator drive the same object.

Positions:

* ``published_position``: end of the records this module has encoded (in memory);
* ``archive_position``: end of what the local archive has durably appended;
* ``commit_position``: the quorum position, the end of what may be applied.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..archive.record import RECORD_HEADER, RECORD_HEADER_LENGTH
from ..protocol import version as protocol_version
from ..protocol.codec import encode_into
from ..protocol.egress import AdminResponse, Challenge, EgressMessage, NewLeaderEvent, SessionEvent
from ..protocol.enums import (
    AdminResponseCode,
    CloseReason,
    ClusterTimeUnit,
    EventCode,
    Role,
)
from ..protocol.ingress import (
    AdminRequest,
    ChallengeResponse,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionMessageHeader,
)
from ..protocol.log import (
    LogMessage,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)
from .auth import Authenticator
from .session import ClusterSession, State
from .timers import TimerService

log = logging.getLogger("cluster.consensus")

_RECORD_ZERO = b"\0" * RECORD_HEADER_LENGTH
_pack_record_header = RECORD_HEADER.pack_into
_crc32 = zlib.crc32


class EgressPort(Protocol):
    """Where the consensus module's egress goes; every method only enqueues."""

    def connect(self, egress_id: int, channel: str) -> None:
        """Start connecting to a client's egress channel ``host:port``."""

    def send(self, egress_id: int, message: EgressMessage) -> bool:
        """Queue a message; False if the egress is unknown or its backlog is full."""

    def close(self, egress_id: int) -> None:
        """Flush what is queued, then close the egress connection."""


@dataclass(slots=True)
class ConsensusConfig:
    member_id: int = 0
    session_timeout_ns: int = 10_000_000_000
    max_concurrent_sessions: int = 10
    ingress_endpoints: str = ""
    member_count: int = 1
    app_version: int = protocol_version.compose(0, 0, 1)


@dataclass(slots=True)
class Counters:
    """Things counted rather than raised (operators see them in describe/TUI)."""

    unknown_session_messages: int = 0
    wrong_term_messages: int = 0
    rejected_sessions: int = 0
    redirected_sessions: int = 0
    timed_out_sessions: int = 0
    egress_failures: int = 0


class _Proxy:
    """The :class:`~cluster.core.auth.SessionProxy` handed to the authenticator."""

    __slots__ = ("_cm", "_session")

    def __init__(self, cm: ConsensusModule, session: ClusterSession) -> None:
        self._cm = cm
        self._session = session

    @property
    def session_id(self) -> int:
        return self._session.cluster_session_id

    def challenge(self, encoded_challenge: bytes) -> bool:
        s = self._session
        sent = self._cm.egress.send(
            s.egress_id, Challenge(s.correlation_id, s.cluster_session_id, encoded_challenge)
        )
        if sent:
            s.state = State.CHALLENGED
        return sent

    def authenticate(self, encoded_principal: bytes = b"") -> bool:
        self._session.encoded_principal = encoded_principal
        self._session.state = State.AUTHENTICATED
        return True

    def reject(self) -> None:
        self._session.state = State.REJECTED
        self._session.rejection = (
            EventCode.AUTHENTICATION_REJECTED,
            "session failed authentication",
        )


class ConsensusModule:
    """Session management and log sequencing for one member."""

    def __init__(
        self,
        config: ConsensusConfig,
        egress: EgressPort,
        authenticator: Authenticator | None = None,
        *,
        log_position: int = 0,
        epoch_offset_ns: int = 0,
    ) -> None:
        self.config = config
        self.egress = egress
        self.authenticator = authenticator or Authenticator()
        self.epoch_offset_ns = epoch_offset_ns
        self.role = Role.FOLLOWER
        self.leadership_term_id = -1
        self.leader_member_id = -1
        self.sessions: dict[int, ClusterSession] = {}
        self.pending_sessions: list[ClusterSession] = []
        self.rejected_sessions: list[ClusterSession] = []
        self.redirect_sessions: list[ClusterSession] = []
        self.next_session_id = 1
        self._next_local_egress_id = -1
        self.timers = TimerService()
        self.counters = Counters()
        # The log: records encoded but not yet taken by the archive.
        self.log_buffer = bytearray()
        self._log_buffer_base = log_position
        self.archive_position = log_position
        self.commit_position = log_position
        self.member_positions: dict[int, int] = {config.member_id: log_position}
        self.timestamp = 0  # cluster time (epoch ms) of the latest log entry
        self._awaiting_ok: list[ClusterSession] = []

    # ------------------------------------------------------------------ time and log

    def cluster_time(self, now_ns: int) -> int:
        """Cluster time in ms, never behind the last timestamp put on the log."""
        t = (now_ns + self.epoch_offset_ns) // 1_000_000
        return t if t > self.timestamp else self.timestamp

    @property
    def published_position(self) -> int:
        return self._log_buffer_base + len(self.log_buffer)

    def _append(self, message: LogMessage) -> int:
        """Encode ``message`` as a log record; return the position after it."""
        buf = self.log_buffer
        start = len(buf)
        buf += _RECORD_ZERO
        encode_into(message, buf, start + RECORD_HEADER_LENGTH)
        with memoryview(buf) as view, view[start + RECORD_HEADER_LENGTH :] as body:
            crc = _crc32(body)
        _pack_record_header(buf, start, len(buf) - start - RECORD_HEADER_LENGTH, crc)
        return self._log_buffer_base + len(buf)

    def take_log_batch(self) -> tuple[int, bytearray] | None:
        """Hand the encoded records to the shell: ``(start_position, data)``."""
        if not self.log_buffer:
            return None
        batch = (self._log_buffer_base, self.log_buffer)
        self._log_buffer_base += len(self.log_buffer)
        self.log_buffer = bytearray()
        return batch

    def on_archive_position(self, position: int) -> None:
        """The local archive has durably appended up to ``position``."""
        self.archive_position = position
        self.member_positions[self.config.member_id] = position
        if self.role is Role.LEADER:
            self._update_commit_position(self.quorum_position())

    def quorum_position(self) -> int:
        """Highest position a quorum of members has durably appended."""
        positions = sorted(self.member_positions.values(), reverse=True)
        quorum = self.config.member_count // 2 + 1
        if len(positions) < quorum:
            return self.commit_position
        return positions[quorum - 1]

    def _update_commit_position(self, position: int) -> None:
        if position <= self.commit_position:
            return
        self.commit_position = position
        if self._awaiting_ok:
            still: list[ClusterSession] = []
            for session in self._awaiting_ok:
                if session.opened_log_position <= position:
                    self._send_open_event(session)
                else:
                    still.append(session)
            self._awaiting_ok = still

    # ------------------------------------------------------------------ leadership

    def become_leader(self, leadership_term_id: int, now_ns: int) -> None:
        """Start a term as leader: NewLeadershipTermEvent, then NewLeaderEvent to sessions."""
        self.role = Role.LEADER
        self.leadership_term_id = leadership_term_id
        self.leader_member_id = self.config.member_id
        timestamp = self.cluster_time(now_ns)
        self.timestamp = timestamp
        position = self.published_position
        self._append(
            NewLeadershipTermEvent(
                leadership_term_id=leadership_term_id,
                log_position=position,
                timestamp=timestamp,
                term_base_log_position=position,
                leader_member_id=self.config.member_id,
                log_session_id=0,
                time_unit=ClusterTimeUnit.MILLIS,
                app_version=self.config.app_version,
            )
        )
        for session in self.sessions.values():
            session.time_of_last_activity_ns = now_ns
            session.has_new_leader_event_pending = True
            session.egress_connected = False
            self.egress.connect(session.egress_id, session.response_channel)

    # ------------------------------------------------------------------ ingress

    def on_session_connect(self, request: SessionConnectRequest, now_ns: int) -> None:
        if self.role is Role.LEADER:
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
        session.state = State.CONNECTING
        self.egress.connect(egress_id, request.response_channel)
        if self.role is not Role.LEADER:
            self.redirect_sessions.append(session)
            return
        if not protocol_version.is_compatible(request.version):
            session.rejection = (
                EventCode.ERROR,
                f"invalid client version {protocol_version.to_string(request.version)}, "
                f"cluster is {protocol_version.to_string(protocol_version.PROTOCOL_VERSION)}",
            )
            self.rejected_sessions.append(session)
        elif len(self.sessions) + len(self.pending_sessions) >= self.config.max_concurrent_sessions:
            session.rejection = (EventCode.ERROR, "concurrent session limit")
            self.rejected_sessions.append(session)
        else:
            self.authenticator.on_connect_request(
                session_id, request.encoded_credentials, self.cluster_time(now_ns)
            )
            self.pending_sessions.append(session)

    def _open_session(
        self, cluster_session_id: int, leadership_term_id: int
    ) -> ClusterSession | None:
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state is not State.OPEN:
            self.counters.unknown_session_messages += 1
            return None
        if leadership_term_id != self.leadership_term_id:
            self.counters.wrong_term_messages += 1
            return None
        return session

    def on_ingress_message(self, header: SessionMessageHeader, now_ns: int) -> bool:
        """Sequence one application message into the log (the hot path)."""
        if self.role is not Role.LEADER:
            return False
        session = self.sessions.get(header.cluster_session_id)
        if (
            session is None
            or session.state is not State.OPEN
            or header.leadership_term_id != self.leadership_term_id
        ):
            self._open_session(header.cluster_session_id, header.leadership_term_id)  # count it
            return False
        session.time_of_last_activity_ns = now_ns
        t = (now_ns + self.epoch_offset_ns) // 1_000_000
        if t > self.timestamp:
            self.timestamp = t
        header.timestamp = self.timestamp
        self._append(header)
        return True

    def on_ingress_messages(self, headers: Iterable[SessionMessageHeader], now_ns: int) -> None:
        for header in headers:
            self.on_ingress_message(header, now_ns)

    def on_keepalive(self, msg: SessionKeepAlive, now_ns: int) -> None:
        if self.role is not Role.LEADER:
            return
        session = self._open_session(msg.cluster_session_id, msg.leadership_term_id)
        if session is not None:
            session.time_of_last_activity_ns = now_ns

    def on_session_close_request(self, msg: SessionCloseRequest, now_ns: int) -> None:
        if self.role is not Role.LEADER:
            return
        session = self._open_session(msg.cluster_session_id, msg.leadership_term_id)
        if session is not None:
            self._close_session(session, CloseReason.CLIENT_ACTION, now_ns)

    def on_challenge_response(self, msg: ChallengeResponse, now_ns: int) -> None:
        for session in self.pending_sessions:
            if (
                session.cluster_session_id == msg.cluster_session_id
                and session.correlation_id == msg.correlation_id
                and session.state is State.CHALLENGED
            ):
                session.time_of_last_activity_ns = now_ns
                self.authenticator.on_challenge_response(
                    session.cluster_session_id, msg.encoded_credentials, self.cluster_time(now_ns)
                )
                return
        self.counters.unknown_session_messages += 1

    def on_admin_request(self, msg: AdminRequest, now_ns: int) -> None:
        if self.role is not Role.LEADER:
            return
        session = self._open_session(msg.cluster_session_id, msg.leadership_term_id)
        if session is None:
            return
        session.time_of_last_activity_ns = now_ns
        self.egress.send(
            session.egress_id,
            AdminResponse(
                cluster_session_id=session.cluster_session_id,
                correlation_id=msg.correlation_id,
                request_type=msg.request_type,
                response_code=AdminResponseCode.ERROR,
                message="admin requests are not supported by this node yet",
            ),
        )

    # ------------------------------------------------------------------ egress status

    def on_egress_connected(self, egress_id: int) -> None:
        session = self._find_by_egress(egress_id)
        if session is not None:
            session.egress_connected = True

    def on_egress_failed(self, egress_id: int) -> None:
        """The egress connection could not be made or broke."""
        self.counters.egress_failures += 1
        session = self._find_by_egress(egress_id)
        if session is None:
            return
        session.egress_connected = False
        if session.state is not State.OPEN:
            # nobody to tell: drop a session that never opened
            for group in (self.pending_sessions, self.redirect_sessions, self.rejected_sessions):
                if session in group:
                    group.remove(session)
            session.state = State.CLOSED

    def _find_by_egress(self, egress_id: int) -> ClusterSession | None:
        session = self.sessions.get(egress_id) if egress_id > 0 else None
        if session is not None:
            return session
        for group in (self.pending_sessions, self.redirect_sessions, self.rejected_sessions):
            for candidate in group:
                if candidate.egress_id == egress_id:
                    return candidate
        return None

    # ------------------------------------------------------------------ service requests

    def on_service_close_session(self, cluster_session_id: int, now_ns: int) -> bool:
        """The clustered service asked to close a session (SERVICE_ACTION)."""
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state is not State.OPEN:
            return False
        if self.role is Role.LEADER:
            self._close_session(session, CloseReason.SERVICE_ACTION, now_ns)
        else:
            session.state = State.CLOSING  # the leader will put the close on the log
        return True

    def schedule_timer(self, correlation_id: int, deadline: int) -> None:
        self.timers.schedule(correlation_id, deadline)

    def cancel_timer(self, correlation_id: int) -> bool:
        return self.timers.cancel(correlation_id)

    # ------------------------------------------------------------------ duty cycle

    def consensus_work(self, now_ns: int) -> int:
        """Leader work done every cycle: fire expired timers into the log."""
        if self.role is not Role.LEADER or not len(self.timers):
            return 0
        now_ms = self.cluster_time(now_ns)
        expired = self.timers.poll(now_ms)
        for correlation_id, _deadline in expired:
            self.timestamp = now_ms
            self._append(TimerEvent(self.leadership_term_id, correlation_id, now_ms))
        return len(expired)

    def on_slow_tick(self, now_ns: int) -> int:
        """Housekeeping every slow tick (10 ms by default); returns work done."""
        work = self._send_redirects_and_rejections()
        if self.role is Role.LEADER:
            work += self._process_pending_sessions(now_ns)
            work += self._check_sessions(now_ns)
        return work

    def _send_redirects_and_rejections(self) -> int:
        work = 0
        if self.redirect_sessions:
            remaining = []
            for session in self.redirect_sessions:
                if not session.egress_connected:
                    remaining.append(session)
                    continue
                self.egress.send(
                    session.egress_id,
                    SessionEvent(
                        cluster_session_id=session.cluster_session_id,
                        correlation_id=session.correlation_id,
                        leadership_term_id=self.leadership_term_id,
                        leader_member_id=self.leader_member_id,
                        code=EventCode.REDIRECT,
                        version=protocol_version.PROTOCOL_VERSION,
                        detail=self.config.ingress_endpoints,
                    ),
                )
                self.egress.close(session.egress_id)
                self.counters.redirected_sessions += 1
                work += 1
            self.redirect_sessions = remaining
        if self.rejected_sessions:
            remaining = []
            for session in self.rejected_sessions:
                if not session.egress_connected:
                    remaining.append(session)
                    continue
                self._reject(session)
                work += 1
            self.rejected_sessions = remaining
        return work

    def _reject(self, session: ClusterSession) -> None:
        code, detail = session.rejection or (EventCode.ERROR, "rejected")
        self.egress.send(
            session.egress_id,
            SessionEvent(
                cluster_session_id=session.cluster_session_id,
                correlation_id=session.correlation_id,
                leadership_term_id=self.leadership_term_id,
                leader_member_id=self.leader_member_id,
                code=EventCode(code),
                version=protocol_version.PROTOCOL_VERSION,
                detail=detail,
            ),
        )
        self.egress.close(session.egress_id)
        session.state = State.CLOSED
        self.counters.rejected_sessions += 1

    def _process_pending_sessions(self, now_ns: int) -> int:
        if not self.pending_sessions:
            return 0
        work = 0
        now_ms = self.cluster_time(now_ns)
        remaining: list[ClusterSession] = []
        for session in self.pending_sessions:
            if session.state is State.CONNECTING and session.egress_connected:
                session.state = State.CONNECTED
                work += 1
            if session.state is State.CONNECTED:
                self.authenticator.on_connected_session(_Proxy(self, session), now_ms)
            elif session.state is State.CHALLENGED:
                self.authenticator.on_challenged_session(_Proxy(self, session), now_ms)
            if session.state is State.AUTHENTICATED:
                self._open_pending_session(session, now_ns)
                work += 1
                continue
            if session.state is State.REJECTED and session.egress_connected:
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
                self.egress.close(session.egress_id)
                session.state = State.CLOSED
                work += 1
                continue
            remaining.append(session)
        self.pending_sessions = remaining
        return work

    def _open_pending_session(self, session: ClusterSession, now_ns: int) -> None:
        timestamp = self.cluster_time(now_ns)
        self.timestamp = timestamp
        session.opened_log_position = self._append(
            SessionOpenEvent(
                leadership_term_id=self.leadership_term_id,
                correlation_id=session.correlation_id,
                cluster_session_id=session.cluster_session_id,
                timestamp=timestamp,
                response_stream_id=session.response_stream_id,
                response_channel=session.response_channel,
                encoded_principal=session.encoded_principal,
            )
        )
        session.state = State.OPEN
        session.time_of_last_activity_ns = now_ns
        self.sessions[session.cluster_session_id] = session
        # OK goes out once the SessionOpenEvent is committed, so a client never holds a
        # session that a new leader could not know about.
        session.has_open_event_pending = True
        self._awaiting_ok.append(session)

    def _send_open_event(self, session: ClusterSession) -> None:
        if session.state is not State.OPEN:
            return
        sent = self.egress.send(
            session.egress_id,
            SessionEvent(
                cluster_session_id=session.cluster_session_id,
                correlation_id=session.correlation_id,
                leadership_term_id=self.leadership_term_id,
                leader_member_id=self.leader_member_id,
                code=EventCode.OK,
                version=protocol_version.PROTOCOL_VERSION,
                detail="",
            ),
        )
        if sent:
            session.has_open_event_pending = False

    def _check_sessions(self, now_ns: int) -> int:
        work = 0
        timeout = self.config.session_timeout_ns
        for session in list(self.sessions.values()):
            if session.state is State.CLOSING:
                self._close_session(
                    session, session.close_reason or CloseReason.SERVICE_ACTION, now_ns
                )
                work += 1
            elif now_ns - session.time_of_last_activity_ns > timeout:
                log.info("session %d timed out", session.cluster_session_id)
                self.counters.timed_out_sessions += 1
                self._close_session(session, CloseReason.TIMEOUT, now_ns)
                work += 1
            elif session.has_new_leader_event_pending and session.egress_connected:
                if self.egress.send(
                    session.egress_id,
                    NewLeaderEvent(
                        leadership_term_id=self.leadership_term_id,
                        cluster_session_id=session.cluster_session_id,
                        leader_member_id=self.leader_member_id,
                        ingress_endpoints=self.config.ingress_endpoints,
                    ),
                ):
                    session.has_new_leader_event_pending = False
                    work += 1
            elif (
                session.has_open_event_pending
                and session.opened_log_position <= self.commit_position
            ):
                self._send_open_event(session)  # retry a send that found no room
        return work

    def _close_session(self, session: ClusterSession, reason: CloseReason, now_ns: int) -> None:
        timestamp = self.cluster_time(now_ns)
        self.timestamp = timestamp
        self._append(
            SessionCloseEvent(
                leadership_term_id=self.leadership_term_id,
                cluster_session_id=session.cluster_session_id,
                timestamp=timestamp,
                close_reason=reason,
            )
        )
        session.close_reason = reason
        session.state = State.CLOSED
        del self.sessions[session.cluster_session_id]
        self.egress.send(
            session.egress_id,
            SessionEvent(
                cluster_session_id=session.cluster_session_id,
                correlation_id=session.correlation_id,
                leadership_term_id=self.leadership_term_id,
                leader_member_id=self.leader_member_id,
                code=EventCode.CLOSED,
                version=protocol_version.PROTOCOL_VERSION,
                detail=reason.name,
            ),
        )
        self.egress.close(session.egress_id)

    # ------------------------------------------------- log replay (followers, recovery)

    def on_replay_log_message(self, message: Any, position: int, now_ns: int) -> None:
        """Mirror the leader's session bookkeeping from a committed log entry."""
        if isinstance(message, SessionMessageHeader):
            if message.timestamp > self.timestamp:
                self.timestamp = message.timestamp  # a new leader must not stamp earlier
            return
        if isinstance(message, SessionOpenEvent):
            session = ClusterSession(
                message.cluster_session_id,
                message.cluster_session_id,
                message.correlation_id,
                message.response_stream_id,
                message.response_channel,
                now_ns,
            )
            session.state = State.OPEN
            session.opened_log_position = position
            session.encoded_principal = message.encoded_principal
            self.sessions[session.cluster_session_id] = session
            if message.cluster_session_id >= self.next_session_id:
                self.next_session_id = message.cluster_session_id + 1
        elif isinstance(message, SessionCloseEvent):
            self.sessions.pop(message.cluster_session_id, None)
        elif isinstance(message, TimerEvent):
            self.timers.cancel(message.correlation_id)
        elif isinstance(message, NewLeadershipTermEvent):
            self.leadership_term_id = message.leadership_term_id
            self.leader_member_id = message.leader_member_id
        if message.timestamp > self.timestamp:
            self.timestamp = message.timestamp
