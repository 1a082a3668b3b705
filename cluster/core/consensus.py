"""The consensus module, sans-IO: role and term changes, and message dispatch.

:class:`ConsensusModule` is what a member *is* in the cluster: follower, candidate or
leader of a term.  It takes every input (a client's ingress message, a member's
consensus message, a tick, a report from the shell) and dispatches it, with one step
function per role, to the part that owns the work:

* :class:`~cluster.core.log.ReplicatedLog`: positions, the unstable tail, terms, time;
* :class:`~cluster.core.tracker.ProgressTracker`: the leader's view of each follower,
  and the commit position a quorum makes;
* :class:`~cluster.core.follower.FollowerReplica`: a follower's log matching;
* :class:`~cluster.core.sessions.SessionManager`: client sessions;
* :class:`~cluster.core.election.Election`: one election, while it runs;
* :class:`~cluster.core.control.ClusterControl`: module state and cluster actions;
* :class:`~cluster.core.voting.VotingRights`: whether this member may vote (a catch-up
  member, whose state is new or lost, may not);
* :class:`~cluster.core.handover.Handover`: a leader handing leadership over;
* :class:`~cluster.core.lease.Lease`: whether this member has a live leader, which a
  member of a later term is then not let depose;
* :class:`~cluster.core.reads.ReadIndex`: the leader's queries (no log: read rounds);
* the :class:`~cluster.core.timers.TimerService` and the
  :class:`~cluster.core.pending.PendingServiceMessageTracker`.

It performs no I/O and never calls into the shell.  Time arrives as ``now_ns``
arguments (a monotonic clock in nanoseconds).  What the shell must do it hands out:
the log to persist (:meth:`take_log_batch`, ``log.pending_truncate``), the commit
position to apply up to, and :meth:`take_events` (role changes, leader ready, refused
members).  Messages leave through ports that only enqueue
(:class:`~cluster.core.base.EgressPort`, :class:`~cluster.core.base.ConsensusPort`).
The shell reports back what it did: :meth:`on_archive_position`, :meth:`on_truncated`,
:meth:`on_applied`.  One driver loop (:func:`cluster.core.driver.drive`) does this for
the node, the simulator and the unit tests alike.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from ..protocol.consensus import (
    VOTE_TRANSFER,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    ConsensusMessage,
    RequestVote,
    SnapshotChunkAck,
    TimeoutNow,
    Vote,
)
from ..protocol.enums import ModuleState, Role
from ..protocol.ingress import AdminRequest, IngressMessage, QueryRequest, SessionMessageHeader
from ..protocol.log import LogMessage
from .auth import Authenticator, AuthorisationService
from .base import (
    ConsensusConfig,
    ConsensusPort,
    Counters,
    EgressPort,
    Event,
    IngressSource,
    LeaderReady,
    MemberRefused,
    NoConsensus,
    NoStorage,
    RoleChanged,
    StorageError,
    StoragePort,
)
from .control import ClusterControl
from .due import append_due
from .election import Election, ElectionState, answer_vote
from .follower import LEADER_MESSAGES, FollowerReplica
from .handover import Handover
from .lease import LATER_TERM_MESSAGES, Lease
from .log import ReplicatedLog
from .pending import PendingServiceMessageTracker
from .reads import ReadIndex
from .replay import mirror_entry
from .replication import LeaderReplication
from .session import CLIENT_REQUESTS, State
from .sessions import SessionManager
from .terms import TermHistory
from .timers import TimerService
from .validate import far_term, sender_of
from .voting import VotingRights

log = logging.getLogger("cluster.consensus")


class ConsensusModule:
    """One member's consensus state: its role and terms, and the parts that do the work."""

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
        catching_up: bool = False,
        rng: random.Random | None = None,
        authorisation: AuthorisationService | None = None,
        token: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.config = config
        self.egress = egress
        self.consensus: ConsensusPort = consensus or NoConsensus()
        self.storage: StoragePort = storage or NoStorage()
        self.voting = VotingRights(config.member_id, self.storage, catching_up=catching_up)
        self.rng = rng or random.Random()
        self.counters = Counters()
        self.log = ReplicatedLog(log_position, terms or TermHistory(), epoch_offset_ns)
        # role and terms
        self.role = Role.FOLLOWER
        self.leadership_term_id = self.log.terms.last_term
        self.candidate_term_id = max(candidate_term_id, self.leadership_term_id)
        self.leader_member_id = -1
        self.election: Election | None = None
        self._had_election = False
        self._events: list[Event] = []
        # the parts
        self.replication = LeaderReplication(config, self.log, self, self.consensus)
        self.followers = self.replication.progress  # the leader's view (read-only)
        self.handover = Handover(config, self.log, self.followers, self, self.consensus)
        self.lease = Lease(config, self, self.followers, self.handover, self.counters)
        self.replica = FollowerReplica(
            config,
            self.log,
            self,
            self.consensus,
            self.storage,
            self.counters,
            self._refuse,
            self.voting,
        )
        self.session_manager = SessionManager(
            config,
            egress,
            authenticator or Authenticator(),
            self.log,
            self._append,
            self,
            self.counters,
            self.rng,
            token,
        )
        self.sessions = self.session_manager.sessions  # the open sessions (read-only view)
        self.control = ClusterControl(
            self.log, self._append, self, authorisation or AuthorisationService(), self.counters
        )
        self.timers = TimerService()
        self.service_messages = PendingServiceMessageTracker()
        self.reads = ReadIndex(
            *(config, self, self.replication, self.sessions, egress, self.counters),
            self.session_manager.query_links,
            self.session_manager.applied,
        )
        self.ready_position = -1
        """A leader takes client work once it has applied the log up to here."""
        self.last_leader_heard_ns = 0
        self._source: IngressSource | None = None
        """The client connection the ingress messages being handled came on."""

    # ------------------------------------------------------------------ views

    @property
    def commit_position(self) -> int:
        return self.log.commit_position

    @property
    def is_ready_leader(self) -> bool:
        """Leader with its election complete: it takes client work."""
        return self.role is Role.LEADER and self.election is None

    @property
    def in_election(self) -> bool:
        return self.election is not None

    @property
    def election_state(self) -> ElectionState:
        if self.election is not None:
            return self.election.state
        return ElectionState.CLOSED if self._had_election else ElectionState.INIT

    @property
    def leader_deadline_ns(self) -> int | None:
        """When a follower gives up on its silent leader (None when not following)."""
        if self.role is Role.LEADER or self.election is not None:
            return None
        return self.last_leader_heard_ns + self.config.leader_heartbeat_timeout_ns

    # ------------------------------------------------------------------ shell contract

    def take_log_batch(self) -> tuple[int, bytearray] | None:
        """The log to persist: ``(start_position, data)`` (see also
        ``log.pending_truncate``, a truncation to do first)."""
        return self.log.take_batch()

    def take_events(self) -> Sequence[Event]:
        """What happened since the last call (role changes, leader ready, members whose
        messages were refused), in order."""
        events = self._events
        if not events:
            return ()
        self._events = []
        return events

    def on_archive_position(self, position: int, now_ns: int = 0) -> None:
        """The local archive has durably appended up to ``position``."""
        if not self.log.on_archived(position):
            return
        if self.role is Role.LEADER:
            self._maybe_commit()
        elif self.leader_member_id >= 0:
            self.replica.advance_commit(self.replica.leader_commit_position)
            if self.voting.catching_up:
                self.replica.check_caught_up(now_ns)
            self.replica.report(now_ns, force=False)

    def on_truncated(self, position: int) -> None:
        """The shell has truncated the archive to ``position`` (``log.pending_truncate``)."""
        if self.log.on_truncated(position) and self.role is not Role.LEADER:
            self.replica.advance_commit(self.replica.leader_commit_position)

    def on_applied(self, position: int, now_ns: int = 0) -> None:
        """The service has applied the log up to ``position`` (a new leader that has
        applied its term's first entry becomes ready)."""
        self.log.applied_position = position
        if self.election is not None and self.role is Role.LEADER:
            self._check_leader_ready(now_ns)

    def restore(self, position: int, ends: Iterable[int] = ()) -> None:
        """Recovery replayed (applied) the log up to ``position``: it is committed and no
        more is known to be (later entries wait for a leader's commit position); ``ends``
        are where the records of the log after it end."""
        self.log.restore(position, ends)

    def _refuse(self, member: int, reason: str) -> None:
        """A member's message contradicts what this member knows: counted, logged, and
        handed to the shell (which closes that member's link)."""
        self.counters.invalid_messages += 1
        log.warning(
            "member %d refused a message of member %d: %s", self.config.member_id, member, reason
        )
        self._events.append(MemberRefused(member, reason))

    def _append(self, message: LogMessage) -> int:
        # only a leader applies its own records (a follower mirrors what it replays)
        return self.log.append(message, self.role is Role.LEADER)

    def set_candidate_term(self, term: int) -> bool:
        """Raise the candidate term, saved first; False if it could not be (not acted on)."""
        try:
            if term > self.candidate_term_id:
                self.storage.save_candidate_term(term)
                self.candidate_term_id = term
        except StorageError:
            return False
        return True

    def _set_role(self, role: Role) -> None:
        if role is not self.role:
            self.role = role
            self._events.append(RoleChanged(role))

    def enter_election(
        self, now_ns: int, reason: str, *, is_startup: bool = False, transfer: bool = False
    ) -> None:
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
        self.replica.verified_end = -1
        self.election = self._new_election(now_ns, is_startup, reason, transfer)
        self.election.do_work(now_ns)
        self._after_election(now_ns)

    def _new_election(
        self, now_ns: int, is_startup: bool, reason: str, transfer: bool = False
    ) -> Election:
        self._had_election = True
        return Election(
            self.config,
            self.log,
            self,
            self.voting,
            self.consensus,
            self.rng,
            now_ns,
            is_startup=is_startup,
            reason=reason,
            transfer=transfer,
        )

    def _after_election(self, now_ns: int) -> None:
        election = self.election
        if election is not None and election.won_term is not None and self.role is not Role.LEADER:
            self.become_leader(election.won_term, now_ns)

    def _step_down(self) -> None:
        self.counters.queries_refused += self.reads.step_down(-1)
        self.handover.clear()
        self.session_manager.step_down()
        self.replication.stop()
        self.timers.restore_fired()
        self.log.own_records.clear()
        self._set_role(Role.FOLLOWER)

    def become_leader(self, leadership_term_id: int, now_ns: int) -> None:
        """Won the election: start the term with a NewLeadershipTermEvent.

        The leader takes client work only once that event is committed and applied
        (:meth:`_check_leader_ready`): then every earlier entry is committed too, the
        service has seen it all and the sessions are known.
        """
        self.set_candidate_term(leadership_term_id)
        self.leadership_term_id = leadership_term_id
        self.leader_member_id = self.config.member_id
        rlog = self.log
        position, self.ready_position = rlog.start_term(
            leadership_term_id, self.config.member_id, self.config.app_version, now_ns
        )
        self.storage.record_term(leadership_term_id, position, rlog.timestamp)
        self.service_messages.reset_appended()
        self.replication.start(position, now_ns)
        self.reads.new_term()
        if self.election is None:
            self.election = self._new_election(now_ns, False, "won")
        self.election.state = ElectionState.LEADER_LOG_REPLICATION
        log.info(
            "member %d is LEADER of term %d at log position %d",
            self.config.member_id,
            leadership_term_id,
            position,
        )
        self._set_role(Role.LEADER)

    def _check_leader_ready(self, now_ns: int) -> None:
        election = self.election
        if self.role is not Role.LEADER or election is None:
            return
        if self.log.commit_position < self.ready_position:
            return
        if self.log.applied_position < self.ready_position:
            election.state = ElectionState.LEADER_READY
            return
        self.election = None
        self.session_manager.lead(now_ns)
        self._events.append(LeaderReady(self.leadership_term_id, self.log.commit_position))

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
        if term == self.leadership_term_id and 0 <= self.leader_member_id != leader:
            # a term has one leader: a second one claiming it is a buggy or forged member
            self._refuse(leader, f"claims to lead term {term}, which {self.leader_member_id} leads")
            return False
        if not self.set_candidate_term(term):
            return False  # its term could not be saved: a member must not follow it yet
        if self.role is Role.LEADER:
            self._step_down()
        changed = self.leadership_term_id != term or self.leader_member_id != leader
        if changed:
            self.replica.new_leader()
            log.info("member %d follows leader %d in term %d", self.config.member_id, leader, term)
        self.leadership_term_id = term
        self.leader_member_id = leader
        self.election = None
        self.last_leader_heard_ns = now_ns
        if changed:
            self.session_manager.redirect_held()  # now that the view names the leader
        return True

    # ------------------------------------------------------------------ dispatch

    def on_message(
        self, message: IngressMessage | ConsensusMessage | IngressSource, now_ns: int
    ) -> None:
        """Dispatch one message from a client or a member (application messages first).

        An :class:`IngressSource` says which client connection the ingress messages
        after it came on (the shell puts one ahead of each read); a client message
        with none before it is dropped."""
        if type(message) is SessionMessageHeader:
            self.on_ingress_message(message, now_ns)
        elif type(message) is IngressSource:
            self._source = message
        elif type(message) is QueryRequest:
            self.reads.on_query(message, self._source, now_ns)
        elif isinstance(message, CLIENT_REQUESTS):
            source = self._source
            if source is None or source.closed:
                self.counters.foreign_session_messages += 1
            elif isinstance(message, AdminRequest):
                self.on_admin_request(message, now_ns)
            else:
                self.session_manager.on_request(message, source, now_ns)
        else:
            self.on_consensus_message(cast(ConsensusMessage, message), now_ns)

    def on_batch(self, batch: Iterable[Any], now_ns: int) -> None:
        """Handle one inbox batch in order, then forget its connection.  The hot path: a
        ready leader taking client work sequences the session messages of open sessions
        of the connection and term here, without :meth:`on_message`'s checks for each,
        when each is its session's next (one compare; anything else, a duplicate, a gap
        or an unsequenced message, goes the slow way)."""
        append, sessions, source, term, stamp = self.log.append, self.sessions, None, -1, 0
        open_ = State.OPEN  # looked up once: an enum member costs a slow attribute lookup
        for message in batch:
            if source is not None and type(message) is SessionMessageHeader:
                session = sessions.get(message.cluster_session_id)
                if (
                    session is not None
                    and session.source is source
                    and session.state is open_
                    and message.leadership_term_id == term
                    and message.sequence == session.last_sequence + 1
                ):
                    session.last_sequence = message.sequence
                    session.time_of_last_activity_ns = now_ns
                    if not stamp:
                        stamp = self.log.stamp(now_ns)  # as on_ingress_message stamps
                    message.timestamp = stamp
                    append(message, True)
                    continue
            self.on_message(message, now_ns)  # which may change what the checks are
            running = (
                self.control.module_state is not ModuleState.SUSPENDED and not self.handover.active
            )
            source = self._source if running and self.is_ready_leader else None
            if source is not None:
                term, stamp = self.leadership_term_id, 0
        self._source = None

    def on_consensus_message(self, message: ConsensusMessage, now_ns: int) -> None:
        """Dispatch a member's message to the step function of this member's role (a
        term too far ahead of this member's is refused: :func:`far_term`)."""
        if (refused := far_term(message, self.candidate_term_id)) is not None:
            self._refuse(sender_of(message), refused)
            return
        if isinstance(message, RequestVote):
            self._on_request_vote(message, now_ns)
        elif (
            isinstance(message, LATER_TERM_MESSAGES)
            and message.leadership_term_id > self.leadership_term_id
            and self.lease.keeps_its_leader(message, now_ns)
        ):
            return
        elif self.role is Role.LEADER:
            self._step_leader(message, now_ns)
        elif self.election is not None:
            self._step_candidate(message, now_ns)
        else:
            self._step_follower(message, now_ns)

    def _step_leader(self, message: ConsensusMessage, now_ns: int) -> None:
        if isinstance(message, AppendPosition):
            self._on_append_position(message, now_ns)
        elif isinstance(message, SnapshotChunkAck):
            self.replication.on_snapshot_ack(message, now_ns)
        elif isinstance(message, (AppendRequest, CommitPosition)):
            self._step_follower(message, now_ns)  # another leader of a later term?
        elif isinstance(message, CanvassPosition):
            later = message.leadership_term_id > self.candidate_term_id
            if later and not self.lease.leader_in_lease(now_ns):
                self.enter_election(now_ns, f"member {message.follower_member_id} saw a later term")
                self._step_candidate(message, now_ns)
            # Otherwise nothing to do: this leader's heartbeats reach a canvassing member
            # and, with a term at least as high as the member's, end its election.
        elif isinstance(message, Vote) and self.election is not None:
            self._step_candidate(message, now_ns)  # a late vote of the ballot just won

    def _step_candidate(self, message: ConsensusMessage, now_ns: int) -> None:
        election = self.election
        if election is None:
            return
        if isinstance(message, CanvassPosition):
            election.on_canvass_position(message, now_ns)
        elif isinstance(message, Vote):
            election.on_vote(message, now_ns)
            self._after_election(now_ns)
        else:
            self._step_follower(message, now_ns)  # a leader's message ends the election

    def _step_follower(self, message: ConsensusMessage, now_ns: int) -> None:
        if isinstance(message, LEADER_MESSAGES):
            if self._accept_leader(message.leadership_term_id, message.leader_member_id, now_ns):
                self.replica.on_append_request(message, now_ns)
                if self.voting.catching_up:
                    self.replica.check_caught_up(now_ns)
            else:
                self.replica.send_position(
                    message.leader_member_id,
                    self.log.published_position,
                    False,
                    term=self.candidate_term_id,
                )
        elif isinstance(message, TimeoutNow):
            if self.handover.on_timeout_now(message, self.voting.catching_up):
                reason = f"member {message.leader_member_id} hands leadership over"
                self.enter_election(now_ns, reason, transfer=True)
        elif isinstance(message, CommitPosition):
            if (
                message.leadership_term_id == self.leadership_term_id
                and message.leader_member_id == self.leader_member_id
                and self.role is not Role.LEADER
            ):
                self.last_leader_heard_ns = now_ns
                self.replica.advance_commit(message.log_position)
                if self.voting.catching_up:
                    self.replica.check_caught_up(now_ns)
                if message.read_round:  # a read round: this member still follows it
                    self.replica.report(now_ns, force=True, read_round=message.read_round)
            elif message.read_round and message.leadership_term_id < self.leadership_term_id:
                self.replica.refuse_read_round(message.leader_member_id, self.candidate_term_id)
            elif message.leadership_term_id > self.candidate_term_id:
                self._accept_leader(message.leadership_term_id, message.leader_member_id, now_ns)
        elif isinstance(message, AppendPosition):
            self._on_append_position(message, now_ns)

    def _on_request_vote(self, msg: RequestVote, now_ns: int) -> None:
        # A candidate its leader handed leadership to is heard even while that leader
        # is alive; any other is ignored then.
        transfer = msg.flags & VOTE_TRANSFER
        if self.lease.leader_in_lease(now_ns) and not transfer:
            return  # ignored, as a follower with a live leader ignores it
        if msg.candidate_term_id <= self.candidate_term_id:
            # a term this member has already voted in, or older: refused
            answer_vote(self.consensus, self.config.member_id, self.log, msg, False)
            return
        if self.role is Role.LEADER:
            # Even while its own election is completing: a higher term means a quorum
            # may be moving on without us.
            self.enter_election(now_ns, f"vote requested by member {msg.candidate_member_id}")
        elif self.election is None:
            if not transfer:
                return  # a follower with a live leader ignores candidates (sticky leader)
            self.enter_election(now_ns, f"member {msg.candidate_member_id} takes leadership over")
        assert self.election is not None
        self.election.on_request_vote(msg, now_ns)

    # ------------------------------------------------------------------ leader replication

    def _on_append_position(self, msg: AppendPosition, now_ns: int) -> None:
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
        acknowledged = self.replication.on_append_position(msg, now_ns)
        if msg.read_round and acknowledged is not None:
            self.reads.on_ack(msg.follower_member_id, msg.read_round)
        if acknowledged:
            self._maybe_commit()
            if self.handover.active:
                self.handover.maybe_send()
        elif acknowledged is None:
            self._refuse(
                msg.follower_member_id,
                f"reports log position {msg.log_position} verified, beyond this leader's "
                f"log ({self.log.published_position})",
            )

    def _maybe_commit(self) -> None:
        position = self.replication.quorum_position()
        if position is not None:
            self.log.commit(position)
            self.session_manager.on_commit(position)
            # Not sent at once: the next AppendRequest to each follower carries the
            # commit position, and the slow tick tells any follower no append reached
            # (an idle log).  This spares every follower a wake-up per commit (a fifth of
            # a follower's CPU at one message in flight); followers only need it to
            # apply, which nothing waits for.  A leader that stops sends it first.

    # ------------------------------------------------------------------ ingress

    def on_ingress_message(self, header: SessionMessageHeader, now_ns: int) -> bool:
        """Sequence one application message into the log: only the session's next
        (exactly once in, in order: a duplicate is dropped, a gap dropped and the client
        told to resend); an unsequenced one (``sequence`` 0) as it comes."""
        if self.election is not None or self.role is not Role.LEADER or self.handover.active:
            self.counters.wrong_term_messages += 1
            return False
        session = self.sessions.get(header.cluster_session_id)
        if (
            session is None
            or session.state is not State.OPEN
            or header.leadership_term_id != self.leadership_term_id
        ):
            # count it
            self.session_manager.lookup_open(header.cluster_session_id, header.leadership_term_id)
            return False
        if session.source is not self._source or session.source is None:
            self.counters.foreign_session_messages += 1
            return False
        session.time_of_last_activity_ns = now_ns
        sequence = header.sequence
        if sequence and sequence != session.last_sequence + 1:
            self.session_manager.sequencing.out_of_sequence(session, header, now_ns)
            return False
        header.timestamp = self.log.stamp(now_ns)
        if self.control.module_state is ModuleState.SUSPENDED:
            if not self.control.hold(header):  # sequenced on RESUME
                return False  # not held: its client resends it after the next gap
        else:
            self.log.append(header, True)
        if sequence:
            session.last_sequence = sequence
        return True

    def on_admin_request(self, msg: AdminRequest, now_ns: int) -> None:
        self.control.on_admin_request(msg, self.session_manager, self._source, now_ns)

    def consensus_work(self, now_ns: int) -> int:
        """Work done every cycle: election progress, leader readiness, expired timers."""
        election = self.election
        if election is not None:
            if self.role is Role.LEADER:
                self._check_leader_ready(now_ns)
            else:
                work = election.do_work(now_ns)
                self._after_election(now_ns)
                return work
        if not self.is_ready_leader:
            return 0
        self.reads.start_round(now_ns)  # the queries of this cycle
        if self.handover.active or not self.control.active:
            return 0  # a leader handing over, or SUSPENDED, takes no new work
        return append_due(
            self.log, self.leadership_term_id, self.service_messages, self.timers, now_ns
        )

    def on_slow_tick(self, now_ns: int) -> int:
        """Housekeeping every slow tick (10 ms by default); returns work done."""
        sessions = self.session_manager
        work = sessions.answer_waiting(now_ns)
        if self.role is Role.LEADER:
            if self.is_ready_leader:
                work += sessions.tick(now_ns, active=self.control.active)
                if not self.handover.active:  # an automatic snapshot, when one is due
                    work += self.control.on_slow_tick(now_ns)
            if not self.replication.on_slow_tick(now_ns):
                self.enter_election(now_ns, "inactive follower quorum")
                work += 1
            elif (reason := self.handover.on_slow_tick(now_ns)) is not None:
                self.enter_election(now_ns, f"steps down: {reason}")
                work += 1
        elif self.election is None:
            self.replica.report(now_ns, force=False)
        return work + self.consensus_work(now_ns)

    def on_leader_timeout(self, now_ns: int) -> bool:
        """The shell's leader deadline passed: start an election if it really has."""
        deadline = self.leader_deadline_ns
        if deadline is None or now_ns < deadline:
            return False
        self.enter_election(now_ns, "leader heartbeat timeout")
        return True

    # ------------------------------------------------- log replay (followers, recovery)

    def on_replay_log_message(self, message: Any, position: int, now_ns: int) -> None:
        """Mirror the leader's session bookkeeping from a committed log entry
        (:mod:`cluster.core.replay`)."""
        mirror_entry(self, message, position, now_ns)
