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
import random
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from ..archive.record import RECORD_HEADER
from ..protocol import version as protocol_version
from ..protocol.codec import encode as _encode
from ..protocol.consensus import (
    APPEND_POSITION_VERIFIED,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    ConsensusMessage,
    RequestVote,
    Vote,
)
from ..protocol.egress import AdminResponse, Challenge, EgressMessage, NewLeaderEvent, SessionEvent
from ..protocol.enums import (
    CLUSTER_ACTION_FLAG_TERMINATE,
    AdminRequestType,
    AdminResponseCode,
    CloseReason,
    ClusterAction,
    ClusterTimeUnit,
    EventCode,
    ModuleState,
    Role,
)
from ..protocol.ingress import (
    AdminRequest,
    ChallengeResponse,
    IngressMessage,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionMessageHeader,
)
from ..protocol.log import (
    ClusterActionRequest,
    LogMessage,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)
from .auth import Authenticator, AuthorisationService
from .election import Election, ElectionState
from .pending import PendingServiceMessageTracker, service_session_id
from .session import ClusterSession, State
from .terms import TermHistory
from .timers import TimerService

log = logging.getLogger("cluster.consensus")

_pack_record_header = RECORD_HEADER.pack

EGRESS_RETRY_NS = 1_000_000_000
"""How often a leader re-dials the lost egress of an open session."""
_crc32 = zlib.crc32


class EgressPort(Protocol):
    """Where the consensus module's egress goes; every method only enqueues."""

    def connect(self, egress_id: int, channel: str) -> None:
        """Start connecting to a client's egress channel ``host:port``."""

    def send(self, egress_id: int, message: EgressMessage) -> bool:
        """Queue a message; False if the egress is unknown or its backlog is full."""

    def close(self, egress_id: int) -> None:
        """Flush what is queued, then close the egress connection."""


class ConsensusPort(Protocol):
    """Member-to-member messages; sending only enqueues and may silently drop."""

    def send(self, member_id: int, message: ConsensusMessage) -> bool: ...


class StoragePort(Protocol):
    """The few durable writes the consensus module makes itself (rare, synchronous)."""

    def save_candidate_term(self, candidate_term_id: int) -> None:
        """Persist the highest term voted in or seen, before it is acted upon."""

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        """Persist the start of a term in the recording log."""

    def remove_terms_from(self, position: int) -> None:
        """Forget terms starting at or after a truncation point."""


class _NoConsensus:
    def send(self, member_id: int, message: ConsensusMessage) -> bool:
        return False


class _NoStorage:
    def save_candidate_term(self, candidate_term_id: int) -> None:
        pass

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        pass

    def remove_terms_from(self, position: int) -> None:
        pass


@dataclass(slots=True)
class ConsensusConfig:
    member_id: int = 0
    member_ids: tuple[int, ...] = (0,)
    session_timeout_ns: int = 10_000_000_000
    max_concurrent_sessions: int = 10
    ingress_endpoints: str = ""
    app_version: int = protocol_version.compose(0, 0, 1)
    leader_heartbeat_interval_ns: int = 200_000_000
    leader_heartbeat_timeout_ns: int = 10_000_000_000
    election_timeout_ns: int = 1_000_000_000
    election_status_interval_ns: int = 100_000_000
    startup_canvass_timeout_ns: int = 60_000_000_000

    @property
    def member_count(self) -> int:
        return len(self.member_ids)


@dataclass(slots=True)
class FollowerState:
    """The leader's view of one follower (Raft's nextIndex/matchIndex, in bytes)."""

    member_id: int
    next_position: int
    match_position: int = -1
    last_heard_ns: int = 0
    commit_sent: int = -1
    """The highest commit position shipped to it (in an AppendRequest or CommitPosition)."""


@dataclass(slots=True)
class Counters:
    """Things counted rather than raised (operators see them in describe/TUI)."""

    unknown_session_messages: int = 0
    wrong_term_messages: int = 0
    rejected_sessions: int = 0
    redirected_sessions: int = 0
    timed_out_sessions: int = 0
    egress_failures: int = 0
    elections: int = 0
    truncations: int = 0
    truncated_bytes: int = 0


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
        consensus: ConsensusPort | None = None,
        storage: StoragePort | None = None,
        terms: TermHistory | None = None,
        candidate_term_id: int = -1,
        rng: random.Random | None = None,
        authorisation: AuthorisationService | None = None,
    ) -> None:
        self.config = config
        self.egress = egress
        self.authenticator = authenticator or Authenticator()
        self.authorisation = authorisation or AuthorisationService()
        self.module_state = ModuleState.ACTIVE
        self.held_messages: list[SessionMessageHeader] = []
        self.max_held_messages = 100_000
        self.epoch_offset_ns = epoch_offset_ns
        self.consensus: ConsensusPort = consensus or _NoConsensus()
        self.storage: StoragePort = storage or _NoStorage()
        self.rng = rng or random.Random()
        self.terms = terms or TermHistory()
        self.role = Role.FOLLOWER
        self.leadership_term_id = self.terms.last_term
        self.candidate_term_id = max(candidate_term_id, self.leadership_term_id)
        self.leader_member_id = -1
        self.election: Election | None = None
        self.election_state = ElectionState.INIT
        self.on_role_change: Callable[[Role], None] | None = None
        self.on_leader_ready: Callable[[], None] | None = None
        # leader state
        self.followers: dict[int, FollowerState] = {}
        self.term_base_position = -1
        self.ready_position = -1
        self._next_commit_heartbeat_ns = 0
        # follower state
        self.verified_end = -1
        self.leader_commit_position = -1
        self.last_leader_heard_ns = 0
        self._last_reported: tuple[int, int] = (-1, -1)
        self._next_append_report_ns = 0
        self.pending_truncate: int | None = None
        self.applied_position = log_position
        self.sessions: dict[int, ClusterSession] = {}
        self.pending_sessions: list[ClusterSession] = []
        self.rejected_sessions: list[ClusterSession] = []
        self.redirect_sessions: list[ClusterSession] = []
        self.next_session_id = 1
        self._next_local_egress_id = -1
        self.timers = TimerService()
        self.service_messages = PendingServiceMessageTracker()
        self.counters = Counters()
        # The log: records encoded but not yet taken by the archive.
        self.log_buffer = bytearray()
        self._log_buffer_base = log_position
        #: ``(start, end, message)`` of each record this module encoded, until the shell
        #: applies it: a leader applies its own records from these objects instead of
        #: decoding the bytes it just encoded (:meth:`take_own_records`)
        self.own_records: deque[tuple[int, int, LogMessage]] = deque()
        self.archive_position = log_position
        self.commit_position = log_position
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
        body = _encode(message)
        buf = self.log_buffer
        start = self._log_buffer_base + len(buf)
        buf += _pack_record_header(len(body), _crc32(body))
        buf += body
        end = self._log_buffer_base + len(buf)
        if self.role is Role.LEADER:  # only a leader applies them (a follower mirrors)
            self.own_records.append((start, end, message))
        return end

    def take_own_records(self, start: int, stop: int) -> list[tuple[int, int, LogMessage]]:
        """The records this module encoded in ``[start, stop)``, as long as they are
        contiguous from ``start`` (empty if the record at ``start`` is not one of them).

        Records before ``start`` are dropped: whatever was applied another way is never
        asked for again.  The messages must not be changed: they are what was encoded."""
        own = self.own_records
        while own and own[0][0] < start:
            own.popleft()
        taken: list[tuple[int, int, LogMessage]] = []
        if own and own[0][0] == start:
            position = start
            while own and own[0][0] == position and own[0][1] <= stop:
                record = own.popleft()
                taken.append(record)
                position = record[1]
        return taken

    def take_log_batch(self) -> tuple[int, bytearray] | None:
        """Hand the encoded records to the shell: ``(start_position, data)``."""
        if not self.log_buffer:
            return None
        batch = (self._log_buffer_base, self.log_buffer)
        self._log_buffer_base += len(self.log_buffer)
        self.log_buffer = bytearray()
        return batch

    @property
    def quorum(self) -> int:
        return self.config.member_count // 2 + 1

    def on_archive_position(self, position: int, now_ns: int = 0) -> None:
        """The local archive has durably appended up to ``position``."""
        if self.pending_truncate is not None:
            return  # a write that finished before the truncation it is about to undergo
        self.archive_position = position
        if self.role is Role.LEADER:
            self._update_leader_commit(now_ns)
        elif self.leader_member_id >= 0:
            self._report_append_position(now_ns, force=False)

    def on_truncated(self, position: int) -> None:
        """The shell has truncated the archive to ``position`` (see :attr:`pending_truncate`)."""
        self.archive_position = min(self.archive_position, position)
        if self.pending_truncate is not None and self.pending_truncate >= position:
            self.pending_truncate = None
            if self.role is not Role.LEADER:
                self._advance_follower_commit(self.leader_commit_position)

    def on_applied(self, position: int) -> None:
        """The service has applied the log up to ``position``."""
        self.applied_position = position

    def quorum_position(self) -> int:
        """Highest position a quorum of members has durably appended (leader's view)."""
        positions = [self.archive_position]
        positions.extend(max(f.match_position, 0) for f in self.followers.values())
        positions.sort(reverse=True)
        return positions[self.quorum - 1]

    def _update_leader_commit(self, now_ns: int) -> None:
        position = self.quorum_position()
        # Only an entry of the current term may be committed by counting replicas (Raft
        # section 5.4.2); earlier entries commit with it.
        if position > self.term_base_position and position > self.commit_position:
            self._update_commit_position(position)
            # Not sent at once: the next AppendRequest to each follower carries the
            # commit position, and the slow tick tells any follower no append reached
            # (an idle log).  This spares every follower a wake-up per commit (a fifth of
            # a follower's CPU at one message in flight); followers only need it to
            # apply, which nothing waits for.  A leader that stops sends it first.

    def _broadcast_commit(self, now_ns: int) -> None:
        self.send_commit_position(every=True)
        self._next_commit_heartbeat_ns = now_ns + self.config.leader_heartbeat_interval_ns

    def send_commit_position(self, *, every: bool = False) -> None:
        """A CommitPosition to each follower that no AppendRequest has told the current
        commit position (every slow tick, so followers learn it within one, and before a
        leader stops), or to ``every`` follower (the heartbeat)."""
        position = self.commit_position
        message: CommitPosition | None = None
        for member, follower in self.followers.items():
            if every or follower.commit_sent < position:
                if message is None:
                    message = CommitPosition(
                        leadership_term_id=self.leadership_term_id,
                        log_position=position,
                        leader_member_id=self.config.member_id,
                    )
                self.consensus.send(member, message)
                follower.commit_sent = position

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

    @property
    def is_ready_leader(self) -> bool:
        """Leader with its election complete: it takes client work."""
        return self.role is Role.LEADER and self.election is None

    def set_candidate_term(self, term: int) -> None:
        if term > self.candidate_term_id:
            self.storage.save_candidate_term(term)
            self.candidate_term_id = term

    def _set_role(self, role: Role) -> None:
        if role is not self.role:
            self.role = role
            if self.on_role_change is not None:
                self.on_role_change(role)

    def enter_election(self, now_ns: int, reason: str, *, is_startup: bool = False) -> None:
        """Start an election (from any role); followers mirror sessions meanwhile."""
        log.info(
            "member %d enters election (term %d): %s",
            self.config.member_id,
            self.leadership_term_id,
            reason,
        )
        self.counters.elections += 1
        if self.role is Role.LEADER:
            self._step_down()
        self.leader_member_id = -1
        self.verified_end = -1
        self.election = Election(self, now_ns, is_startup=is_startup, reason=reason)
        self.election_state = self.election.state
        self.election.do_work(now_ns)
        self._sync_election_state()

    def _step_down(self) -> None:
        # Connecting clients are redirected to whoever leads next, not left waiting.
        self.redirect_sessions.extend(self.pending_sessions)
        self.pending_sessions.clear()
        for session in self.sessions.values():
            self.egress.close(session.egress_id)
            session.egress_connected = False
        self._awaiting_ok.clear()
        self.followers.clear()
        self.timers.restore_fired()
        self.own_records.clear()
        self._set_role(Role.FOLLOWER)

    def _sync_election_state(self) -> None:
        if self.election is not None:
            self.election_state = self.election.state

    def become_leader(self, leadership_term_id: int, now_ns: int) -> None:
        """Won the election: start the term with a NewLeadershipTermEvent.

        The leader takes client work only once that event is committed and applied
        (:meth:`_check_leader_ready`): then every earlier entry is committed too, the
        service has seen it all and the sessions are known.
        """
        self.set_candidate_term(leadership_term_id)
        self.leadership_term_id = leadership_term_id
        self.leader_member_id = self.config.member_id
        timestamp = self.cluster_time(now_ns)
        self.timestamp = timestamp
        position = self.published_position
        self.terms.append(leadership_term_id, position)
        self.storage.record_term(leadership_term_id, position, timestamp)
        self.term_base_position = position
        self.service_messages.reset_appended()
        self.ready_position = self._append(
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
        self.followers = {
            m: FollowerState(m, next_position=position, last_heard_ns=now_ns)
            for m in self.config.member_ids
            if m != self.config.member_id
        }
        if self.election is None:
            self.election = Election(self, now_ns, is_startup=False, reason="won")
        self.election.state = ElectionState.LEADER_LOG_REPLICATION
        self._sync_election_state()
        log.info(
            "member %d is LEADER of term %d at log position %d",
            self.config.member_id,
            leadership_term_id,
            position,
        )
        self._set_role(Role.LEADER)

    def _check_leader_ready(self, now_ns: int) -> None:
        if (
            self.role is not Role.LEADER
            or self.election is None
            or self.commit_position < self.ready_position
        ):
            return
        if self.applied_position < self.ready_position:
            self.election.state = ElectionState.LEADER_READY
            self._sync_election_state()
            return
        self.election = None
        self.election_state = ElectionState.CLOSED
        for session in self.sessions.values():
            if session.restored_from_snapshot:
                # seed 004: sessions loaded from a snapshot are not reconnected; the
                # timeout check closes them at once with a SessionCloseEvent on the log
                session.time_of_last_activity_ns = now_ns - self.config.session_timeout_ns - 1
                continue
            session.time_of_last_activity_ns = now_ns
            session.has_new_leader_event_pending = True
            session.egress_connected = False
            self.egress.connect(session.egress_id, session.response_channel)
        if self.on_leader_ready is not None:
            self.on_leader_ready()  # the service may now send real egress

    def reset_sessions(self, sessions: Iterable[tuple[int, int, str, bytes]], now_ns: int) -> None:
        """Rebuild the session table from the service's committed view.

        ``sessions`` yields ``(cluster_session_id, response_stream_id, response_channel,
        encoded_principal)``.  Used when a leader steps down: sessions it opened or closed
        in entries that never committed must not survive in its table.
        """
        self.sessions = {}
        for session_id, stream_id, channel, principal in sessions:
            session = ClusterSession(session_id, session_id, 0, stream_id, channel, now_ns)
            session.state = State.OPEN
            session.encoded_principal = principal
            self.sessions[session_id] = session
            self.next_session_id = max(self.next_session_id, session_id + 1)

    # ------------------------------------------------------------------ consensus messages

    def on_consensus_message(self, message: ConsensusMessage, now_ns: int) -> None:
        if isinstance(message, AppendRequest):
            self.on_append_request(message, now_ns)
        elif isinstance(message, AppendPosition):
            self.on_append_position(message, now_ns)
        elif isinstance(message, CommitPosition):
            self.on_commit_position(message, now_ns)
        elif isinstance(message, CanvassPosition):
            self._on_canvass_position(message, now_ns)
        elif isinstance(message, RequestVote):
            self._on_request_vote(message, now_ns)
        elif isinstance(message, Vote) and self.election is not None:
            self.election.on_vote(message, now_ns)
        self._sync_election_state()

    def _on_canvass_position(self, msg: CanvassPosition, now_ns: int) -> None:
        if msg.leadership_term_id > self.candidate_term_id and self.role is Role.LEADER:
            self.enter_election(now_ns, f"member {msg.follower_member_id} saw a later term")
        if self.election is not None:
            self.election.on_canvass_position(msg, now_ns)
        # A leader needs do nothing: its replicator's heartbeats reach a canvassing member
        # and, with a term at least as high as the member's, end that member's election.

    def _on_request_vote(self, msg: RequestVote, now_ns: int) -> None:
        if msg.candidate_term_id <= self.candidate_term_id:
            self._refuse_vote(msg)  # a term this member has already voted in, or older
            return
        if self.role is Role.LEADER:
            # Even while its own election is completing: a higher term means a quorum
            # may be moving on without us.
            self.enter_election(now_ns, f"vote requested by member {msg.candidate_member_id}")
        elif self.election is None:
            return  # a follower with a live leader ignores candidates (sticky leader)
        assert self.election is not None
        self.election.on_request_vote(msg, now_ns)

    def _refuse_vote(self, msg: RequestVote) -> None:
        self.consensus.send(
            msg.candidate_member_id,
            Vote(
                candidate_term_id=msg.candidate_term_id,
                log_leadership_term_id=self.terms.term_at(self.published_position),
                log_position=self.published_position,
                candidate_member_id=msg.candidate_member_id,
                follower_member_id=self.config.member_id,
                vote=False,
            ),
        )

    def _accept_leader(self, term: int, leader: int, now_ns: int) -> bool:
        """A leader of ``term`` spoke: follow it if the term is current, else refuse."""
        if term < self.candidate_term_id or (
            term == self.candidate_term_id
            and self.role is Role.LEADER
            and leader != self.config.member_id
        ):
            return False
        if leader == self.config.member_id:
            return False
        if term > self.candidate_term_id:
            self.set_candidate_term(term)
        if self.role is Role.LEADER:
            self._step_down()
        if self.leadership_term_id != term or self.leader_member_id != leader:
            self.verified_end = -1
            self.leader_commit_position = -1
            for session in self.sessions.values():
                session.restored_from_snapshot = False  # the leader has them live
            log.info("member %d follows leader %d in term %d", self.config.member_id, leader, term)
        self.leadership_term_id = term
        self.leader_member_id = leader
        if self.election is not None:
            self.election = None
            self.election_state = ElectionState.CLOSED
        self.last_leader_heard_ns = now_ns
        return True

    # ---- follower side

    def on_append_request(self, msg: AppendRequest, now_ns: int) -> None:
        if not self._accept_leader(msg.leadership_term_id, msg.leader_member_id, now_ns):
            self._send_append_position(
                msg.leader_member_id, self.published_position, False, term=self.candidate_term_id
            )
            return
        start = msg.log_position
        end = self.published_position
        if start > end:
            self._send_append_position(msg.leader_member_id, end, False)  # gap: send from end
            return
        if self.terms.term_at(start) != msg.prev_term_id:
            # Our entry ending at `start` is from another term: ask the leader to go back
            # to where that term of ours began.  Nothing is truncated yet: only entries
            # that really differ are, once the leader sends them (below).
            hint = self.terms.term_start_containing(start)
            self._send_append_position(msg.leader_member_id, min(hint, start), False)
            return
        data = msg.data
        end_of_data = start + len(data)
        if data:
            if start < self.commit_position:
                skip = min(len(data), self.commit_position - start)  # identical, committed
                data = data[skip:]
                start += skip
            if data and start < self.published_position:
                # Entries we hold from the same term at the same positions are the same
                # entries (log matching): skip them, truncate only from the first one
                # that differs.
                our_term, _ = self.terms.term_for_data_at(start)
                if our_term == msg.data_term_id:
                    same_until = min(
                        self.published_position,
                        end_of_data,
                        self.terms.next_base_after(start) or self.published_position,
                    )
                    data = data[same_until - start :]
                    start = same_until
            if data:
                if start < self.published_position:
                    self._truncate(start)
                if msg.data_term_id != self.terms.last_term:
                    if msg.data_term_id < self.terms.last_term:
                        self.terms.truncate(start)
                        self.storage.remove_terms_from(start)
                    self.terms.append(msg.data_term_id, msg.term_base_log_position)
                    self.storage.record_term(
                        msg.data_term_id, msg.term_base_log_position, self.cluster_time(now_ns)
                    )
                self.log_buffer += data
            self.verified_end = max(self.verified_end, end_of_data)
        else:
            self.verified_end = max(self.verified_end, start)
        self._advance_follower_commit(msg.commit_position)
        if not msg.data:
            self._report_append_position(now_ns, force=True)

    def on_commit_position(self, msg: CommitPosition, now_ns: int) -> None:
        if (
            msg.leadership_term_id == self.leadership_term_id
            and (msg.leader_member_id == self.leader_member_id)
            and self.role is not Role.LEADER
        ):
            self.last_leader_heard_ns = now_ns
            self._advance_follower_commit(msg.log_position)
        elif msg.leadership_term_id > self.candidate_term_id:
            self._accept_leader(msg.leadership_term_id, msg.leader_member_id, now_ns)

    def _advance_follower_commit(self, leader_commit: int) -> None:
        if leader_commit > self.leader_commit_position:
            self.leader_commit_position = leader_commit
        position = min(self.leader_commit_position, self.verified_end, self.published_position)
        if self.pending_truncate is not None:
            # until the archive has dropped the old bytes, positions past the truncation
            # point name bytes that are still the old ones there
            position = min(position, self.pending_truncate)
        if position > self.commit_position:
            self.commit_position = position

    def _truncate(self, position: int) -> None:
        """Drop the log from ``position`` on (never below the commit position)."""
        if position >= self.published_position:
            return
        if position < self.commit_position:
            raise AssertionError(
                f"refusing to truncate committed log: {position} < {self.commit_position}"
            )
        self.counters.truncations += 1
        self.counters.truncated_bytes += self.published_position - position
        self.own_records.clear()
        log.warning(
            "member %d truncates its log from %d to %d (uncommitted entries of an old term)",
            self.config.member_id,
            self.published_position,
            position,
        )
        if position >= self._log_buffer_base:
            del self.log_buffer[position - self._log_buffer_base :]
        else:
            self.log_buffer = bytearray()
            self._log_buffer_base = position
            self.pending_truncate = (
                position if self.pending_truncate is None else min(self.pending_truncate, position)
            )
        if self.terms.truncate(position):
            self.storage.remove_terms_from(position)
        self.verified_end = min(self.verified_end, position)

    def _report_append_position(self, now_ns: int, *, force: bool) -> None:
        if self.leader_member_id < 0 or self.role is Role.LEADER:
            return
        if self.verified_end >= 0:
            position, verified = min(self.archive_position, self.verified_end), True
        else:
            position, verified = self.published_position, False
        key = (self.leadership_term_id, position if verified else -position - 1)
        if force or key != self._last_reported or now_ns >= self._next_append_report_ns:
            self._send_append_position(self.leader_member_id, position, verified)
            self._last_reported = key
            self._next_append_report_ns = now_ns + self.config.leader_heartbeat_interval_ns

    def _send_append_position(
        self, member: int, position: int, verified: bool, *, term: int | None = None
    ) -> None:
        if member < 0 or member == self.config.member_id:
            return
        self.consensus.send(
            member,
            AppendPosition(
                leadership_term_id=self.leadership_term_id if term is None else term,
                log_position=position,
                follower_member_id=self.config.member_id,
                flags=APPEND_POSITION_VERIFIED if verified else 0,
            ),
        )

    # ---- leader side

    def on_append_position(self, msg: AppendPosition, now_ns: int) -> None:
        if msg.leadership_term_id > self.leadership_term_id and (
            self.role is Role.LEADER or msg.leadership_term_id > self.candidate_term_id
        ):
            # A member has moved to a later term (it voted in an election we did not
            # win): this leader is stale and steps down so the cluster can agree again.
            self.set_candidate_term(msg.leadership_term_id)
            if self.role is Role.LEADER or self.election is None:
                self.enter_election(now_ns, f"member {msg.follower_member_id} is in a later term")
            return
        if self.role is not Role.LEADER or msg.leadership_term_id != self.leadership_term_id:
            return
        follower = self.followers.get(msg.follower_member_id)
        if follower is None:
            return
        follower.last_heard_ns = now_ns
        if msg.flags & APPEND_POSITION_VERIFIED:
            follower.match_position = msg.log_position
            if follower.next_position < msg.log_position:
                follower.next_position = msg.log_position
            self._update_leader_commit(now_ns)
        else:
            # A hint (a gap, a disagreeing term, or a follower not yet verified): only
            # ever move back.  Moving forward to an unverified position would undo the
            # search for where the logs agree and can livelock it.
            follower.next_position = min(follower.next_position, msg.log_position)

    def append_request(self, member_id: int, start: int, data: bytes) -> AppendRequest:
        """Build the AppendRequest that ships ``data`` (the log from ``start``) to a follower.

        ``data`` must not cross a term boundary (see :meth:`replication_stop`).
        """
        term, base = self.terms.term_for_data_at(start)
        follower = self.followers.get(member_id)
        if follower is not None:
            follower.commit_sent = self.commit_position
        return AppendRequest(
            leadership_term_id=self.leadership_term_id,
            leader_member_id=self.config.member_id,
            log_position=start,
            prev_term_id=self.terms.term_at(start),
            data_term_id=term,
            term_base_log_position=base,
            commit_position=self.commit_position,
            data=data,
        )

    def replication_stop(self, start: int, limit: int) -> int:
        """End of the chunk to ship from ``start``: at most ``limit``, within one term."""
        boundary = self.terms.next_base_after(start)
        return limit if boundary is None else min(limit, boundary)

    # ------------------------------------------------------------------ ingress

    def on_session_connect(self, request: SessionConnectRequest, now_ns: int) -> None:
        # Only a ready leader assigns session ids: before its log of earlier terms is
        # applied it does not know every id in use.  Until then, redirect (to itself,
        # once ready).
        if self.is_ready_leader:
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
        if not self.is_ready_leader:
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
        if self.election is not None or self.role is not Role.LEADER:
            self.counters.wrong_term_messages += 1
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
        if self.module_state is ModuleState.SUSPENDED:
            if len(self.held_messages) >= self.max_held_messages:
                self.counters.wrong_term_messages += 1
                return False
            self.held_messages.append(header)  # sequenced on RESUME
            return True
        self._append(header)
        return True

    def on_message(self, message: IngressMessage | ConsensusMessage, now_ns: int) -> None:
        """Dispatch one message from a client or a member (application messages first)."""
        if type(message) is SessionMessageHeader:
            self.on_ingress_message(message, now_ns)
        elif isinstance(message, SessionKeepAlive):
            self.on_keepalive(message, now_ns)
        elif isinstance(message, SessionConnectRequest):
            self.on_session_connect(message, now_ns)
        elif isinstance(message, SessionCloseRequest):
            self.on_session_close_request(message, now_ns)
        elif isinstance(message, ChallengeResponse):
            self.on_challenge_response(message, now_ns)
        elif isinstance(message, AdminRequest):
            self.on_admin_request(message, now_ns)
        else:
            self.on_consensus_message(cast(ConsensusMessage, message), now_ns)

    def on_keepalive(self, msg: SessionKeepAlive, now_ns: int) -> None:
        if not self.is_ready_leader:
            return
        session = self._open_session(msg.cluster_session_id, msg.leadership_term_id)
        if session is not None:
            session.time_of_last_activity_ns = now_ns

    def on_session_close_request(self, msg: SessionCloseRequest, now_ns: int) -> None:
        if not self.is_ready_leader:
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
        if not self.is_ready_leader:
            return
        session = self._open_session(msg.cluster_session_id, msg.leadership_term_id)
        if session is None:
            return
        session.time_of_last_activity_ns = now_ns
        if msg.request_type is not AdminRequestType.SNAPSHOT:
            code, text = AdminResponseCode.ERROR, f"unknown request type {msg.request_type}"
        elif not self.authorisation.is_authorised("SNAPSHOT", session.encoded_principal):
            code, text = AdminResponseCode.UNAUTHORISED_ACCESS, "not authorised to SNAPSHOT"
        else:
            ok, text = self.request_cluster_action(ClusterAction.SNAPSHOT, now_ns)
            code = AdminResponseCode.OK if ok else AdminResponseCode.ERROR
        self.egress.send(
            session.egress_id,
            AdminResponse(
                cluster_session_id=session.cluster_session_id,
                correlation_id=msg.correlation_id,
                request_type=msg.request_type,
                response_code=code,
                message=text,
            ),
        )

    def request_cluster_action(
        self, action: ClusterAction, now_ns: int, *, terminate: bool = False
    ) -> tuple[bool, str]:
        """Put a cluster action on the log (leader only); ``(accepted, message)``."""
        name = "SHUTDOWN" if terminate else action.name
        if not self.is_ready_leader:
            return False, (
                f"Current node is not the leader (leaderMemberId = {self.leader_member_id}), "
                f"unable to {name}"
            )
        needed = ModuleState.SUSPENDED if action is ClusterAction.RESUME else ModuleState.ACTIVE
        if self.module_state is not needed:
            return False, (
                f"Unable to {name} as the state of the consensus module is "
                f"{self.module_state.name}, but needs to be {needed.name}"
            )
        timestamp = self.cluster_time(now_ns)
        self.timestamp = timestamp
        self._append(
            ClusterActionRequest(
                leadership_term_id=self.leadership_term_id,
                log_position=self.published_position,
                timestamp=timestamp,
                action=action,
                flags=CLUSTER_ACTION_FLAG_TERMINATE if terminate else 0,
            )
        )
        self._set_module_state(action)
        return True, f"{name} applied successfully"

    def _set_module_state(self, action: ClusterAction) -> None:
        if action is ClusterAction.SUSPEND:
            self.module_state = ModuleState.SUSPENDED
        elif action is ClusterAction.RESUME:
            self.module_state = ModuleState.ACTIVE
            held, self.held_messages = self.held_messages, []
            for header in held:
                self._append(header)

    # ------------------------------------------------------------------ egress status

    def on_egress_connected(self, egress_id: int) -> None:
        session = self._find_by_egress(egress_id)
        if session is not None:
            session.egress_connected = True
            session.egress_retry_ns = None

    def on_egress_failed(self, egress_id: int) -> None:
        """The egress connection could not be made or broke."""
        self.counters.egress_failures += 1
        session = self._find_by_egress(egress_id)
        if session is None:
            return
        session.egress_connected = False
        if session.state is State.OPEN and self.is_ready_leader:
            # The client may still be there (a reset connection): dial it again soon;
            # if it is gone, the session times out as usual.
            session.egress_retry_ns = 0
            return
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
        if self.is_ready_leader:
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
        """Work done every cycle: election progress, leader readiness, expired timers."""
        if self.election is not None:
            if self.role is Role.LEADER:
                self._check_leader_ready(now_ns)
            else:
                work = self.election.do_work(now_ns)
                self._sync_election_state()
                return work
        if not self.is_ready_leader:
            return 0
        work = 0
        if len(self.service_messages):
            for seq, payload in self.service_messages.take_unappended():
                self._append(
                    SessionMessageHeader(
                        self.leadership_term_id,
                        service_session_id(seq),
                        self.cluster_time(now_ns),
                        payload,
                    )
                )
                work += 1
        if not len(self.timers):
            return work
        now_ms = self.cluster_time(now_ns)
        expired = self.timers.poll(now_ms)
        for correlation_id, _deadline in expired:
            self.timestamp = now_ms
            self._append(TimerEvent(self.leadership_term_id, correlation_id, now_ms))
        return work + len(expired)

    def on_slow_tick(self, now_ns: int) -> int:
        """Housekeeping every slow tick (10 ms by default); returns work done."""
        work = self._send_redirects_and_rejections(now_ns)
        if self.role is Role.LEADER:
            if self.is_ready_leader:
                work += self._process_pending_sessions(now_ns)
                work += self._check_sessions(now_ns)
            if now_ns >= self._next_commit_heartbeat_ns:
                self._broadcast_commit(now_ns)
            else:
                self.send_commit_position()
            if self.followers and self._active_followers(now_ns) + 1 < self.quorum:
                self.enter_election(now_ns, "inactive follower quorum")
                work += 1
        elif self.election is None:
            self._report_append_position(now_ns, force=False)
        return work + self.consensus_work(now_ns)

    @property
    def leader_deadline_ns(self) -> int | None:
        """When a follower gives up on its silent leader (None when not following)."""
        if self.role is Role.LEADER or self.election is not None:
            return None
        return self.last_leader_heard_ns + self.config.leader_heartbeat_timeout_ns

    def on_leader_timeout(self, now_ns: int) -> bool:
        """The shell's leader deadline passed: start an election if it really has."""
        deadline = self.leader_deadline_ns
        if deadline is None or now_ns < deadline:
            return False
        self.enter_election(now_ns, "leader heartbeat timeout")
        return True

    def _active_followers(self, now_ns: int) -> int:
        deadline = now_ns - self.config.leader_heartbeat_timeout_ns
        return sum(1 for f in self.followers.values() if f.last_heard_ns >= deadline)

    def _send_redirects_and_rejections(self, now_ns: int) -> int:
        work = 0
        if self.redirect_sessions:
            remaining = []
            for session in self.redirect_sessions:
                if (
                    not session.egress_connected
                    or self.leader_member_id < 0
                    or self.election is not None
                ):
                    if now_ns - session.time_of_last_activity_ns > self.config.session_timeout_ns:
                        self.egress.close(session.egress_id)  # no leader emerged in time
                        work += 1
                    else:
                        remaining.append(session)  # redirect once a leader is known
                    continue
                self._send_session_event(session, EventCode.REDIRECT, self.config.ingress_endpoints)
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

    def _send_session_event(self, session: ClusterSession, code: EventCode, detail: str) -> bool:
        return self.egress.send(
            session.egress_id,
            SessionEvent(
                cluster_session_id=session.cluster_session_id,
                correlation_id=session.correlation_id,
                leadership_term_id=self.leadership_term_id,
                leader_member_id=self.leader_member_id,
                code=code,
                version=protocol_version.PROTOCOL_VERSION,
                detail=detail,
            ),
        )

    def _reject(self, session: ClusterSession) -> None:
        code, detail = session.rejection or (EventCode.ERROR, "rejected")
        self._send_session_event(session, EventCode(code), detail)
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
        sent = self._send_session_event(session, EventCode.OK, "")
        if sent:
            session.has_open_event_pending = False

    def _check_sessions(self, now_ns: int) -> int:
        work = 0
        timeout = self.config.session_timeout_ns
        for session in list(self.sessions.values()):
            if session.egress_retry_ns is not None and now_ns >= session.egress_retry_ns:
                session.egress_retry_ns = now_ns + EGRESS_RETRY_NS  # until it connects
                self.egress.connect(session.egress_id, session.response_channel)
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
        self._send_session_event(session, EventCode.CLOSED, reason.name)
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
        elif isinstance(message, NewLeadershipTermEvent):
            # Only ever forward: a leader re-applying its log from earlier terms (or a
            # follower replaying at start-up) must not move back to an old term.
            if (
                message.leadership_term_id > self.leadership_term_id
                and self.role is not Role.LEADER
            ):
                self.leadership_term_id = message.leadership_term_id
                self.leader_member_id = message.leader_member_id
        elif isinstance(message, ClusterActionRequest) and message.action in (
            ClusterAction.SUSPEND,
            ClusterAction.RESUME,
        ):
            self._set_module_state(message.action)
        if message.timestamp > self.timestamp:
            self.timestamp = message.timestamp
