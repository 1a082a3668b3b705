"""The session manager: every client session from its connect request to its close.

Aeron's consensus module keeps sessions in four groups, and so does this one:

* **pending**: a ready leader accepted a connect request; the session authenticates
  (challenge/response) before it opens;
* **redirect**: a member that is not a ready leader got the request; once a leader is
  known, it is told where the leader is (REDIRECT);
* **rejected**: refused (version, session limit, response channel, authentication);
  told why;
* **open**: its SessionOpenEvent is on the log.  The client hears OK only once that
  event is committed, so it never holds a session a new leader could not know about.

Every answer before OK goes back on the connection the request came on (its
:class:`~cluster.core.base.IngressSource`): a member dials nobody for a stranger.  A
session is bound to that connection: its messages are accepted from no other, until
another connection proves it holds the session with the secret that OK carried
(:class:`~cluster.protocol.ingress.SessionResumeRequest`, after a leader change or a
broken connection).  The session's egress goes back on its connection too, unless the
client named a response channel: then the leader dials it once the session is
authenticated, and only at the address the request came from.

Open sessions time out after ``session_timeout_ns`` without activity; a leader that
steps down redirects its pending sessions, and once the new leader is known tells the
clients still connected to it where to go (REDIRECT); a new leader re-dials every open
session that named a response channel and sends it a NewLeaderEvent.  Sessions whose
egress rides their ingress connection get a NewLeaderEvent every
:data:`~cluster.core.session.EGRESS_HEARTBEAT_NS`: silence tells their client to look for
the leader.  A member that did not run for a second or more (paused) does not count
that time against its sessions' timeouts (:meth:`SessionManager.forgive_stall`: the
shell sees its own slow tick come late).

The manager keeps the open sessions and holds three parts, each with its own state:

* :class:`~cluster.core.admission.SessionAdmission`: connect requests until the session
  opens (pending, redirect, rejected), asking the manager for an id and a slot
  (:class:`~cluster.core.admission.OpenSlots`) and to open it;
* :class:`~cluster.core.resumption.SessionResumption`: resumes on a new connection,
  resumes held while no leader is ready, and close reasons told after the fact;
* :class:`~cluster.core.notify.SessionNotifier`: the events a client hears, which all
  three send.

**Open slots given back.**  An open session whose connection dropped keeps its slot
for a resume, for a whole session timeout while slots are free.  When every open slot
(``max_concurrent_sessions``) is taken and an authenticated session needs one, the
session that has been without a connection longest, for at least
``resume_grace_ns``, is closed (TIMEOUT, through the log like any timeout, so every
member agrees) and its slot goes to the newcomer (:meth:`SessionManager.admit`).
A session whose client is connected is never closed for another; nor one that this
member did not see drop (after a leader change every session gets a whole session
timeout to come back).

Only the consensus module calls this manager; log entries go out through the
``append`` callable it is given.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Callable, Iterable

from ..protocol.enums import CloseReason, EventCode
from ..protocol.ingress import (
    ChallengeResponse,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionResumeRequest,
)
from ..protocol.log import LogMessage, SessionCloseEvent, SessionOpenEvent
from .admission import SessionAdmission
from .auth import Authenticator
from .base import ConsensusConfig, Counters, EgressPort, IngressSource, TermView
from .follower_reads import QueryLinks
from .log import ReplicatedLog
from .notify import SessionNotifier
from .resumption import SessionResumption
from .sequencing import SessionSequencing
from .session import DROPPED, EGRESS_HEARTBEAT_NS, SECRET_BYTES, ClusterSession, State, secret_hash

log = logging.getLogger("cluster.consensus")


EGRESS_RETRY_NS = 1_000_000_000
"""How long a leader waits for a re-dial of a session's egress to connect or fail."""

EGRESS_BACKOFF_MIN_NS = 10_000_000
EGRESS_BACKOFF_MAX_NS = 2_000_000_000
"""A lost egress is re-dialled after a back-off that doubles with each failure, from
10 ms to 2 s, drawn at random in its upper half (jitter, so many sessions of one client
host do not re-dial in step).  It starts again from 10 ms once a connection has stayed up
for :data:`EGRESS_STABLE_NS`: a client that accepts and at once closes is not dialled
a hundred times a second."""

EGRESS_STABLE_NS = 2_000_000_000

STALL_NS = 1_000_000_000
"""A slow tick (due every 10 ms) this late means the member itself stalled (a GC, a VM
steal, SIGSTOP): its clients could not reach it, so the shell has the time forgiven
(:meth:`SessionManager.forgive_stall`), not counted against their session timeouts."""


class SessionManager:
    """The sessions of one member: the open ones, and the parts that admit and resume
    them (see the module)."""

    def __init__(
        self,
        config: ConsensusConfig,
        egress: EgressPort,
        authenticator: Authenticator,
        log: ReplicatedLog,
        append: Callable[[LogMessage], int],
        view: TermView,
        counters: Counters,
        rng: random.Random | None = None,
        token: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.config = config
        self.egress = egress
        self.log = log
        self.append = append
        self.view = view
        self.counters = counters
        self.rng = rng or random.Random()
        self.token = token
        self.sessions: dict[int, ClusterSession] = {}
        """Open sessions by id (never replaced: cleared and refilled)."""
        self.next_session_id = 1
        self._awaiting_ok: list[ClusterSession] = []
        #: sessions closed here whose SessionCloseEvent is not yet committed: (its
        #: position, the session, the reason, the last sequence applied); told CLOSED
        #: once it is, so that what they hear is what every member will apply
        self._awaiting_closed: list[tuple[int, ClusterSession, CloseReason, int]] = []
        #: when the open session longest without a connection lost it (as of the last
        #: slow tick; None: none has), so a connect request that finds every slot taken
        #: knows at once whether one may be given back
        self.earliest_detached_ns: int | None = None
        self.notify = SessionNotifier(config, egress, view, counters)
        self.sequencing = SessionSequencing(self.notify, counters)
        self.applied = self.sequencing.applied
        self.admission = SessionAdmission(
            config, egress, authenticator, log, view, counters, self.notify, self
        )
        self.query_links = QueryLinks(config, egress, view, counters, self.sessions)
        """The sessions' query connections (follower reads, :mod:`~cluster.core.follower_reads`)."""
        self.resumption = SessionResumption(
            *(config, egress, view, counters, self.notify, self.sessions),
            lambda session_id: self.sequencing.progress(session_id),
            self.query_links,
        )

    # ------------------------------------------------------------------ requests

    def holds_session(self, source: IngressSource) -> bool:
        """Whether a connection has a session here: connecting, waiting for a
        redirect or a rejection to go out, resuming, or open."""
        return (
            self.resumption.holds(source)
            or self.query_links.holds(source)
            or any(s.source is source for s in self.sessions.values())
            or self.admission.holds(source)
        )

    def holds(self, session: ClusterSession, source: IngressSource | None) -> bool:
        """Whether ``source`` may act for ``session`` (counted when not)."""
        if session.source is source and source is not None:
            return True
        self.counters.foreign_session_messages += 1
        return False

    def on_source_closed(self, source: IngressSource) -> None:
        """A client's ingress connection closed: sessions not yet open that came on it
        are dropped; open ones it held wait for a resume (or time out; or, once every
        slot is taken and another session needs one, give theirs up after
        ``resume_grace_ns``: see the module)."""
        source.closed = True
        self.admission.on_source_closed(source)
        self.query_links.on_source_closed(source)
        for session in self.sessions.values():
            if session.source is source:
                session.source = None
                session.detached_since_ns = DROPPED  # the next slow tick notes when
                if session.own_connection:
                    self.egress.close(session.egress_id)
                    session.egress_connected = False

    def lookup_open(
        self, cluster_session_id: int, leadership_term_id: int
    ) -> ClusterSession | None:
        """The open session a client message names, if it names one in the current term
        (anything else is counted)."""
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state is not State.OPEN:
            self.counters.unknown_session_messages += 1
            return None
        if leadership_term_id != self.view.leadership_term_id:
            self.counters.wrong_term_messages += 1
            return None
        return session

    def on_request(
        self,
        msg: SessionKeepAlive
        | SessionConnectRequest
        | SessionCloseRequest
        | ChallengeResponse
        | SessionResumeRequest,
        source: IngressSource,
        now_ns: int,
    ) -> None:
        """A client's request about a session, which came on the connection ``source``
        (a query connection takes none but a query-only resume: counted, dropped)."""
        if self.query_links.refuses(msg, source):
            return
        if isinstance(msg, SessionKeepAlive):
            self.on_keepalive(msg, source, now_ns)
        elif isinstance(msg, SessionConnectRequest):
            self.admission.on_connect(msg, source, now_ns)
        elif isinstance(msg, SessionCloseRequest):
            self.on_close_request(msg, source, now_ns)
        elif isinstance(msg, ChallengeResponse):
            self.admission.on_challenge_response(msg, source, now_ns)
        else:
            self.resumption.on_resume(msg, source, now_ns)

    def on_keepalive(self, msg: SessionKeepAlive, source: IngressSource, now_ns: int) -> None:
        if not self.view.is_ready_leader:
            return
        session = self.lookup_open(msg.cluster_session_id, msg.leadership_term_id)
        if session is not None and self.holds(session, source):
            session.time_of_last_activity_ns = now_ns
            if msg.sequence > session.last_sequence:
                # it sent more before this keepalive than reached the log (dropped in a
                # hand-over that did not happen, say) and has sent nothing since
                self.sequencing.ask_resend(session, now_ns)

    def on_close_request(
        self, msg: SessionCloseRequest, source: IngressSource, now_ns: int
    ) -> None:
        if not self.view.is_ready_leader:
            return
        session = self.lookup_open(msg.cluster_session_id, msg.leadership_term_id)
        if session is not None and self.holds(session, source):
            self._close(session, CloseReason.CLIENT_ACTION, now_ns)

    def on_service_close(self, cluster_session_id: int, now_ns: int) -> bool:
        """The clustered service asked to close a session (SERVICE_ACTION)."""
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state is not State.OPEN:
            return False
        if self.view.is_ready_leader:
            self._close(session, CloseReason.SERVICE_ACTION, now_ns)
        else:
            session.state = State.CLOSING  # the leader will put the close on the log
        return True

    # ------------------------------------------------------------------ egress status

    def on_egress_connected(self, egress_id: int) -> None:
        session = self._find_by_egress(egress_id)
        if session is not None:
            session.egress_connected = True
            session.egress_retry_ns = None
            self.sequencing.restart_replies(session)  # a new connection lacks them

    def on_egress_failed(self, egress_id: int) -> None:
        """The egress connection could not be made or broke."""
        self.counters.egress_failures += 1
        session = self._find_by_egress(egress_id)
        if session is None:
            return
        session.egress_connected = False
        session.egress_up_since_ns = None
        # what the broken connection took is lost: a reply given from now on may go at
        # once only after those (a connection dialled again queues it before it is up,
        # and the restart when it is up sends them again, in order)
        self.sequencing.restart_replies(session)
        if session.state is State.OPEN and self.view.is_ready_leader:
            # The client may still be there (a reset connection): dial it again after a
            # back-off (set at the next check); if it is gone, the session times out.
            session.egress_retry_ns = -1
            return

    def _find_by_egress(self, egress_id: int) -> ClusterSession | None:
        session = self.sessions.get(egress_id) if egress_id > 0 else None
        if session is not None:
            return session
        return self.admission.find(egress_id)

    # ------------------------------------------------------------------ leadership

    def on_commit(self, position: int) -> None:
        """The commit position reached ``position``: sessions whose SessionOpenEvent it
        covers hear OK, those whose SessionCloseEvent it covers CLOSED."""
        if self._awaiting_closed and self._awaiting_closed[0][0] <= position:
            closing = self._awaiting_closed
            self._awaiting_closed = [c for c in closing if c[0] > position]
            for at, session, reason, last in closing:
                if at <= position:
                    self._tell_closed(session, reason, last)
        if self._awaiting_ok:
            still: list[ClusterSession] = []
            for session in self._awaiting_ok:
                if session.opened_log_position <= position:
                    self._send_open_event(session)
                else:
                    still.append(session)
            self._awaiting_ok = still

    def step_down(self) -> None:
        """This leader steps down: connecting clients are redirected to whoever leads
        next, not left waiting; open sessions' egress is closed (the next leader
        re-dials it)."""
        self.admission.step_down()
        for session in self.sessions.values():
            self.egress.close(session.egress_id)
            session.egress_connected = False
            session.has_open_event_pending = False
        self._awaiting_ok.clear()
        for _, session, _, _ in self._awaiting_closed:
            # its close may never commit: its client resumes at the next leader, which
            # says whether it is open (no word from here that might be wrong)
            self.egress.close(session.egress_id)
        self._awaiting_closed.clear()

    def redirect_held(self) -> None:
        """A new leader is known: clients still connected here (this member led) are
        told where to go (REDIRECT on their connection), and the connections are
        released: they resume at the leader."""
        for session in self.sessions.values():
            source = session.source
            if source is not None and not source.closed:
                self.notify.event(session, EventCode.REDIRECT, self.config.ingress_endpoints)
            session.source = None

    def lead(self, now_ns: int) -> None:
        """This leader is ready: re-dial every open session that named a response
        channel and tell it of the new leader; the others hear of it once they resume
        on a connection to this member.  Every session is treated alike, however this
        member learnt of it (its log, a snapshot, a restart of the whole cluster): its
        client has a session timeout from now to come back, or it is closed (TIMEOUT)."""
        self.earliest_detached_ns = None
        progress = self.sequencing.progress
        for session in self.sessions.values():
            # ready: the service has applied this member's whole log, so what it
            # applied of each session is what the log holds (exactly once from here)
            known = progress(session.cluster_session_id)
            session.last_sequence = 0 if known is None else known.applied_sequence
            if known is not None:  # its client lacks what it has not confirmed
                known.replies.restart()
            session.resend_asked_ns = None
            session.time_of_last_activity_ns = now_ns
            session.detached_since_ns = None  # a whole timeout, not a grace
            session.has_new_leader_event_pending = True
            if session.own_connection:
                if session.source is not None and not session.source.closed:
                    # still connected here (it was a follower's client): carry on
                    self.egress.attach(session.egress_id, session.source)
                    session.egress_connected = True
                continue
            session.egress_connected = False
            self.egress.connect(session.egress_id, session.response_channel)

    def reset(self, sessions: Iterable[tuple[int, int, str, bytes, bytes]], now_ns: int) -> None:
        """Rebuild the open sessions from the service's committed view: ``(id,
        response_stream_id, response_channel, encoded_principal, secret_hash)`` each.
        Used when a leader steps down: sessions it opened or closed in entries that
        never committed must not survive in its table."""
        held = {s.cluster_session_id: s.source for s in self.sessions.values()}
        self.sessions.clear()
        for session_id, stream_id, channel, principal, hashed in sessions:
            self.resumption.forget_closed(session_id)  # its close never committed
            session = ClusterSession(session_id, session_id, 0, stream_id, channel, now_ns)
            session.state = State.OPEN
            session.encoded_principal = principal
            session.secret_hash = hashed
            session.source = held.get(session_id)
            self.sessions[session_id] = session
            self.next_session_id = max(self.next_session_id, session_id + 1)

    def restore(
        self,
        sessions: Iterable[tuple[int, int, int, str, bytes]],
        next_session_id: int,
        now_ns: int,
    ) -> None:
        """Sessions from a snapshot: ``(id, correlation_id, response_stream_id,
        response_channel, secret_hash)`` each: live sessions like any other, which
        their clients may resume with their secret."""
        self.next_session_id = max(self.next_session_id, next_session_id)
        for session_id, correlation_id, stream_id, channel, hashed in sessions:
            session = ClusterSession(
                session_id, session_id, correlation_id, stream_id, channel, now_ns
            )
            session.state = State.OPEN
            session.secret_hash = hashed
            self.sessions[session_id] = session

    # ------------------------------------------------------------------ the log

    def mirror(
        self, message: SessionOpenEvent | SessionCloseEvent, position: int, now_ns: int
    ) -> None:
        """A session event of another leader's was applied here."""
        if isinstance(message, SessionCloseEvent):
            closed = self.sessions.pop(message.cluster_session_id, None)
            if closed is not None:
                self.resumption.remember_closed(
                    closed.cluster_session_id,
                    message.close_reason,
                    closed.secret_hash,
                    self.applied(closed.cluster_session_id),  # not yet forgotten: applied next
                )
            return
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
        session.secret_hash = message.secret_hash
        self.sessions[session.cluster_session_id] = session
        if message.cluster_session_id >= self.next_session_id:
            self.next_session_id = message.cluster_session_id + 1

    # ------------------------------------------------------------------ open slots

    def new_session_id(self) -> int:
        """The next session id, for a connect request at a ready leader."""
        session_id = self.next_session_id
        self.next_session_id += 1
        return session_id

    def has_room(self, now_ns: int) -> bool:
        """Whether an authenticated session would find a slot now: a free one, or one
        a session without a connection may give back (see the module)."""
        return len(self.sessions) < self.config.max_concurrent_sessions or self._may_give_back(
            now_ns
        )

    def admit(self, session: ClusterSession, now_ns: int) -> bool:
        """Open an authenticated session, in a free slot or in one given back (see the
        module); False when every slot is taken and none may be given back."""
        full = len(self.sessions) >= self.config.max_concurrent_sessions
        if full and not self._give_back_slot(now_ns):
            return False
        self._open(session, now_ns)
        return True

    def _may_give_back(self, now_ns: int) -> bool:
        """Whether an open session may give its slot up for a newcomer (as of the last
        slow tick: a connect request that finds every slot taken is answered without a
        look at every session; the look is made when the newcomer is to open)."""
        earliest = self.earliest_detached_ns
        return earliest is not None and now_ns - earliest >= self.config.resume_grace_ns

    def _slot_to_give_back(self, now_ns: int) -> ClusterSession | None:
        """The open session that would give its slot up for a newcomer: the one whose
        connection dropped here longest ago, at least ``resume_grace_ns`` ago, and
        that no connection has resumed since (None: none may)."""
        grace = self.config.resume_grace_ns
        chosen: ClusterSession | None = None
        for session in self.sessions.values():
            since = session.detached_since_ns
            if since is None or since == DROPPED or now_ns - since < grace:
                continue
            source = session.source
            if session.state is not State.OPEN or (source is not None and not source.closed):
                continue
            if chosen is None or since < (chosen.detached_since_ns or 0):
                chosen = session
        return chosen

    def _give_back_slot(self, now_ns: int) -> bool:
        """Close (TIMEOUT) the session :meth:`_slot_to_give_back` names, so that an
        authenticated session can open in its slot.  Whether one was closed."""
        session = self._slot_to_give_back(now_ns)
        if session is None:
            return False
        since = session.detached_since_ns or 0
        log.info(
            "session %d, without a connection for %.2f s, gives its slot to a new one"
            " (every one of %d is taken)",
            session.cluster_session_id,
            (now_ns - since) / 1e9,
            self.config.max_concurrent_sessions,
        )
        self.counters.sessions_given_back += 1
        self._close(session, CloseReason.TIMEOUT, now_ns)
        return True

    def _open(self, session: ClusterSession, now_ns: int) -> None:
        if session.source is not None:
            session.source.trusted = True
        session.secret = self.token(SECRET_BYTES)
        session.secret_hash = secret_hash(session.secret)
        if not session.own_connection:
            # authenticated: only now is the response channel dialled
            self.egress.connect(session.egress_id, session.response_channel)
        timestamp = self.log.stamp(now_ns)
        session.opened_log_position = self.append(
            SessionOpenEvent(
                leadership_term_id=self.view.leadership_term_id,
                correlation_id=session.correlation_id,
                cluster_session_id=session.cluster_session_id,
                timestamp=timestamp,
                response_stream_id=session.response_stream_id,
                response_channel=session.response_channel,
                encoded_principal=session.encoded_principal,
                secret_hash=session.secret_hash,
            )
        )
        session.state = State.OPEN
        session.time_of_last_activity_ns = now_ns
        self.sessions[session.cluster_session_id] = session
        # OK goes out once the SessionOpenEvent is committed, so a client never holds a
        # session that a new leader could not know about.
        session.has_open_event_pending = True
        self._awaiting_ok.append(session)

    # ------------------------------------------------------------------ slow tick

    def answer_waiting(self, now_ns: int) -> int:
        """Connections waiting here for an answer (every member, every slow tick):
        redirects and rejections of connect requests, resumes held while no leader
        was ready, and query connections of sessions that closed."""
        work = self.admission.send_redirects_and_rejections(now_ns) + self.query_links.sweep()
        return work + self.resumption.answer_held_resumes(now_ns)

    def _send_open_event(self, session: ClusterSession) -> None:
        if session.state is not State.OPEN:
            return
        if session.source is None or session.source.closed:
            session.has_open_event_pending = False  # gone: it resumes, or times out
            session.secret = b""
            return
        if self.notify.event(session, EventCode.OK, "", session.secret):
            session.has_open_event_pending = False
            session.secret = b""

    def tick(self, now_ns: int, *, active: bool) -> int:
        """A ready leader's slow tick: pending sessions move on and open ones are
        checked; while the module is not ACTIVE (SUSPENDED) nothing that appends an
        entry happens (opens, closes, timeouts wait for RESUME, as Aeron gates them)."""
        work = self.admission.process_pending(now_ns) if active else 0
        return work + self.check(now_ns, quiesced=not active)

    def check(self, now_ns: int, *, quiesced: bool = False) -> int:
        """Open sessions: egress re-dials, closes asked for by the service, timeouts,
        NewLeaderEvents and OKs still to send (a ready leader, every slow tick).
        ``quiesced`` (the module is SUSPENDED): nothing is closed (no entry is appended);
        the rest goes on, so clients still hear from their leader."""
        work = 0
        timeout = self.config.session_timeout_ns
        commit = self.log.commit_position
        earliest: int | None = None
        for session in list(self.sessions.values()):
            source = session.source
            if source is not None and not source.closed:
                session.detached_since_ns = None  # connected (resumed)
            elif session.detached_since_ns is not None:
                if session.detached_since_ns == DROPPED:
                    session.detached_since_ns = now_ns  # its grace counts from here
                if earliest is None or session.detached_since_ns < earliest:
                    earliest = session.detached_since_ns
            retry = session.egress_retry_ns
            if retry is not None:
                if retry < 0:  # a dial failed: the next one after a back-off
                    self._back_off(session, now_ns)
                elif now_ns >= retry:
                    session.egress_retry_ns = now_ns + EGRESS_RETRY_NS  # until it connects
                    self.egress.connect(session.egress_id, session.response_channel)
            elif session.egress_connected and session.egress_backoff_ns:
                if session.egress_up_since_ns is None:
                    session.egress_up_since_ns = now_ns
                elif now_ns - session.egress_up_since_ns >= EGRESS_STABLE_NS:
                    session.egress_backoff_ns = 0  # it held: the next loss re-dials soon
            if not quiesced:  # closes and timeouts append an entry: they wait for RESUME
                if session.state is State.CLOSING:
                    reason = session.close_reason or CloseReason.SERVICE_ACTION
                    self._close(session, reason, now_ns)
                    work += 1
                    continue
                if now_ns - session.time_of_last_activity_ns > timeout:
                    log.info("session %d timed out", session.cluster_session_id)
                    self.counters.timed_out_sessions += 1
                    self._close(session, CloseReason.TIMEOUT, now_ns)
                    work += 1
                    continue
            if session.has_open_event_pending:
                # retry an OK that found no room, before anything else the session is
                # sent (the heartbeat below matched every tick and used to shadow this);
                # and nothing else goes before it (no heartbeat before OK)
                if session.opened_log_position <= commit:
                    self._send_open_event(session)
                continue
            if not session.egress_connected:
                continue
            progress = self.sequencing.progress(session.cluster_session_id)
            if session.has_new_leader_event_pending:
                if self.notify.welcome(session, progress):
                    work += 1
            elif progress is not None and progress.replies.sent < progress.replies.last:
                # replies that found no room, or a new connection's: in order
                work += self.notify.replies(session, progress.replies)
            elif progress is not None and progress.applied_sequence > progress.told_sequence:
                # applied since the client was last told (no reply told it): it forgets
                if self.notify.ack(session, progress.applied_sequence, resend=False):
                    progress.told_sequence = progress.applied_sequence
                    work += 1
            elif (
                session.own_connection and now_ns >= session.heartbeat_ns
            ):  # the client's sign that we still lead
                session.heartbeat_ns = now_ns + EGRESS_HEARTBEAT_NS
                self.notify.new_leader(session)
        self.earliest_detached_ns = earliest
        return work

    def forgive_stall(self, gap_ns: int) -> None:
        """The shell found this member did not run for ``gap_ns`` (its slow tick came
        that late: SIGSTOP, a VM steal, a long GC; see :data:`STALL_NS`): no client could
        reach it meanwhile, so the time does not count against any session's timeout."""
        if not self.sessions or not self.view.is_ready_leader:
            return  # (a follower's sessions get a whole timeout when it leads)
        log.warning(
            "this leader stalled for %.1f s (paused, or starved of CPU): its sessions'"
            " timeouts are extended by as much",
            gap_ns / 1e9,
        )
        self.counters.leader_stalls += 1
        for session in self.sessions.values():
            session.time_of_last_activity_ns += gap_ns
            if session.detached_since_ns is not None and session.detached_since_ns >= 0:
                session.detached_since_ns += gap_ns
        if self.earliest_detached_ns is not None:
            self.earliest_detached_ns += gap_ns

    def _back_off(self, session: ClusterSession, now_ns: int) -> None:
        backoff = min(
            max(2 * session.egress_backoff_ns, EGRESS_BACKOFF_MIN_NS), EGRESS_BACKOFF_MAX_NS
        )
        session.egress_backoff_ns = backoff
        half = backoff // 2
        session.egress_retry_ns = now_ns + half + self.rng.randrange(half + 1)

    # ------------------------------------------------------------------ closes

    def end_all(self, reason: CloseReason) -> None:
        """The cluster stops (SHUTDOWN, ABORT: ``reason``): every open session's client
        is told CLOSED with the reason now, while this leader can still say it.  Nothing
        goes on the log (it ends at the action); a restarted cluster times them out."""
        if not self.view.is_ready_leader:
            return
        for session in self.sessions.values():
            # what its log holds as the cluster stops: a restarted cluster applies what
            # of it was committed (messages after the action too)
            last = session.last_sequence
            self.resumption.remember_closed(
                session.cluster_session_id, reason, session.secret_hash, last
            )
            self.notify.event(session, EventCode.CLOSED, reason.name, last_applied=last)

    def _close(self, session: ClusterSession, reason: CloseReason, now_ns: int) -> None:
        timestamp = self.log.stamp(now_ns)
        position = self.append(
            SessionCloseEvent(
                leadership_term_id=self.view.leadership_term_id,
                cluster_session_id=session.cluster_session_id,
                timestamp=timestamp,
                close_reason=reason,
            )
        )
        session.close_reason = reason
        session.state = State.CLOSED
        del self.sessions[session.cluster_session_id]
        self.sequencing.send_replies(session)  # those that found no room go before CLOSED
        # every message of the session in the log comes before its close: once that
        # commits, the service has applied them all, and never a later one
        last = session.last_sequence
        self.resumption.remember_closed(
            session.cluster_session_id, reason, session.secret_hash, last
        )
        self._awaiting_closed.append((position, session, reason, last))

    def _tell_closed(self, session: ClusterSession, reason: CloseReason, last: int) -> None:
        """A session's close is committed: its client hears CLOSED (with the last
        sequence of its messages applied), after the replies it was given that are
        still to go, and its egress closes."""
        self.sequencing.send_replies(session)  # unless the service applied the close
        self.notify.event(session, EventCode.CLOSED, reason.name, last_applied=last)
        self.egress.close(session.egress_id)
