"""Resumption: an open session's client on a new connection, and what it is told.

:class:`SessionResumption`, held by :class:`~cluster.core.sessions.SessionManager`,
handles a connection proving it holds an open session (a SessionResumeRequest with the
secret that OK carried), after a broken connection, a pause or a leader change:

* at a ready leader the session moves to the new connection; the old one, if still
  open, hears CLOSED (:data:`MOVED`) so that whoever holds it learns at once;
* at a member that is not the ready leader the resume is held and answered REDIRECT
  (naming the leader, or none during an election) every second until a leader is
  known, and taken by this member if it becomes the ready leader;
* a query-only resume (follower reads, on any member) binds the connection as a query
  connection of the session once the secret checks out
  (:class:`~cluster.core.follower_reads.QueryLinks`); the session stays where it is;
* a resume of a session that was closed meanwhile hears why (its CloseReason's name:
  TIMEOUT, SERVICE_ACTION...), if it proves it held the session; the last
  :data:`MAX_CLOSED_REMEMBERED` closes are remembered, on every member (leaders when
  they close, followers from the log, and SHUTDOWN and ABORT:
  :meth:`~cluster.core.sessions.SessionManager.end_all`).

It keeps the resumes held and the reasons remembered.  The open sessions are the
manager's: this reads them, and moves a resumed one to its new connection.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Callable

from ..protocol import version as protocol_version
from ..protocol.egress import SessionEvent
from ..protocol.enums import CloseReason, EventCode
from ..protocol.ingress import SessionResumeRequest
from .base import ConsensusConfig, Counters, EgressPort, IngressSource, TermView
from .follower_reads import QueryLinks
from .notify import SessionNotifier
from .session import EGRESS_HEARTBEAT_NS, ClusterSession, SessionProgress, State, secret_hash

MAX_CLOSED_REMEMBERED = 4096
"""Closed sessions whose close reason a member remembers, to answer a resume that comes
after the fact with that reason (the oldest are forgotten first: their clients hear
"no such open session")."""

MOVED = "resumed on another connection"
"""The CLOSED detail a session's old connection hears when another one resumes it."""


class SessionResumption:
    """Resumes, held resumes, and the reasons of closes (see the module)."""

    def __init__(
        self,
        config: ConsensusConfig,
        egress: EgressPort,
        view: TermView,
        counters: Counters,
        notify: SessionNotifier,
        sessions: dict[int, ClusterSession],
        progress: Callable[[int], SessionProgress | None] = lambda session_id: None,
        links: QueryLinks | None = None,
    ) -> None:
        self.config = config
        self.egress = egress
        self.view = view
        self.counters = counters
        self.notify = notify
        self.sessions = sessions
        """The manager's open sessions by id (the same dict: it is never replaced)."""
        self.progress = progress
        """What the service applied of a session's messages, and the replies it kept."""
        if links is None:  # (tests of this part alone)
            links = QueryLinks(config, egress, view, counters, sessions)
        self.links = links
        """The sessions' query connections (query-only resumes bind them)."""
        #: why recently closed sessions were closed, their secret's hash (to tell only
        #: their holder) and the last sequence applied: a resume after the fact hears them
        self.closed_reasons: OrderedDict[int, tuple[CloseReason, bytes, int]] = OrderedDict()
        #: resumes that came to this member while it was not the ready leader:
        #: (connection, request, since, when last told, the leader it was told of)
        self.held_resumes: list[tuple[IngressSource, SessionResumeRequest, int, int, int]] = []

    def holds(self, source: IngressSource) -> bool:
        """Whether a resume that came on the connection ``source`` is held here."""
        return any(held[0] is source for held in self.held_resumes)

    def on_resume(self, request: SessionResumeRequest, source: IngressSource, now_ns: int) -> None:
        """A connection proves it holds an open session (see the module docstring)."""
        if request.query_only:
            self._bind_query_link(request, source)
            return
        view = self.view
        if not view.is_ready_leader:
            # REDIRECT to the leader this member knows (none during an election), and
            # hold on: told again every second, and at once when the leader changes
            config = self.config  # room for every open session and then some
            if (
                len(self.held_resumes)
                >= config.max_concurrent_sessions + config.max_pending_sessions
            ):
                self.held_resumes.pop(0)  # the oldest asks again
            told = self._redirect_held(source, request)
            self.held_resumes.append((source, request, now_ns, now_ns, told))
            return
        session = self.sessions.get(request.cluster_session_id)
        if session is None or session.state is not State.OPEN:
            why, last_applied = self._why_closed(request)
            self._reply(source, request, EventCode.CLOSED, why, last_applied=last_applied)
            return
        if not self._proves(request, session):
            self.counters.rejected_resumes += 1
            self._reply(source, request, EventCode.ERROR, "session secret rejected")
            return
        old = session.source
        if old is not None and old is not source:
            if not old.closed:  # its holder there hears it at once, not by a timeout
                self.notify.event(session, EventCode.CLOSED, MOVED)
            if session.own_connection:
                self.egress.close(session.egress_id)  # detach from the old connection
        session.source = source
        source.trusted = True
        session.time_of_last_activity_ns = now_ns
        if session.own_connection:
            self.egress.attach(session.egress_id, source)
            session.egress_connected = True
        # who leads, and what the log holds of its messages: the client resends the
        # rest at once (if its egress is not up yet, the slow tick's check does it)
        session.has_new_leader_event_pending = True
        progress = self.progress(session.cluster_session_id)
        if progress is not None:  # the replies after the last it received go again
            progress.replies.restart(request.reply)
        if self.notify.welcome(session, progress):
            session.has_new_leader_event_pending = False

    def _bind_query_link(self, request: SessionResumeRequest, source: IngressSource) -> None:
        """A query-only resume, on any member: the connection becomes a query connection
        of the session if it proves it holds it (the secret); else it hears CLOSED (not
        open here: closed, or not yet applied on this member) or ERROR (wrong secret)."""
        session = self.sessions.get(request.cluster_session_id)
        if session is None or session.state is not State.OPEN:
            why, last_applied = self._why_closed(request)
            self._reply(source, request, EventCode.CLOSED, why, last_applied=last_applied)
        elif not self._proves(request, session):
            self.counters.rejected_resumes += 1
            self._reply(source, request, EventCode.ERROR, "session secret rejected")
        else:
            self.links.bind(session, request, source)

    @staticmethod
    def _proves(request: SessionResumeRequest, session: ClusterSession) -> bool:
        """Whether ``request`` carries the secret of ``session``."""
        return bool(session.secret_hash) and hmac.compare_digest(
            secret_hash(bytes(request.session_secret)), session.secret_hash
        )

    def _why_closed(self, request: SessionResumeRequest) -> tuple[str, int]:
        """The reason a session that is not open was closed, for the client that holds
        its secret (its CloseReason's name), and the last sequence of its messages
        applied; anyone else hears it is not open."""
        closed = self.closed_reasons.get(request.cluster_session_id)
        if closed is not None and hmac.compare_digest(
            secret_hash(bytes(request.session_secret)), closed[1]
        ):
            return closed[0].name, closed[2]
        return "no such open session", 0

    def remember_closed(
        self, session_id: int, reason: CloseReason, hashed: bytes, last_applied: int = 0
    ) -> None:
        """A session closed (here, or by an entry of the log): a late resume by the
        holder of the secret whose hash is ``hashed`` hears ``reason``, and
        ``last_applied``, the last sequence of its messages the service applied."""
        closed = self.closed_reasons
        closed[session_id] = (reason, hashed, last_applied)
        while len(closed) > MAX_CLOSED_REMEMBERED:
            closed.popitem(last=False)

    def forget_closed(self, session_id: int) -> None:
        """The close of ``session_id`` never committed: it is open after all."""
        self.closed_reasons.pop(session_id, None)

    def answer_held_resumes(self, now_ns: int) -> int:
        """Resumes that came while no leader was known (every slow tick): answered
        as soon as one is (REDIRECT, or taken by this member once it is the ready
        leader); meanwhile told every second that an election is on (REDIRECT naming
        no leader: the client waits instead of trying elsewhere).  Dropped when their
        connection closes or after a session timeout."""
        if not self.held_resumes:
            return 0
        timeout = self.config.session_timeout_ns
        held, self.held_resumes = self.held_resumes, []
        if self.view.is_ready_leader:
            for source, request, since, _noticed, _told in held:
                if not source.closed and now_ns - since <= timeout:
                    self.on_resume(request, source, now_ns)
            return len(held)
        leader = self._known_leader()
        for entry in held:
            source, request, since, noticed, told = entry
            if source.closed or now_ns - since > timeout:
                continue
            if leader != told or now_ns - noticed >= EGRESS_HEARTBEAT_NS:
                told = self._redirect_held(source, request)
                entry = (source, request, since, now_ns, told)
            self.held_resumes.append(entry)
        return 0

    def _known_leader(self) -> int:
        view = self.view
        return -1 if view.in_election else view.leader_member_id

    def _redirect_held(self, source: IngressSource, request: SessionResumeRequest) -> int:
        leader = self._known_leader()
        detail = self.config.ingress_endpoints if leader >= 0 else ""
        self._reply(source, request, EventCode.REDIRECT, detail, leader=leader)
        return leader

    def _reply(
        self,
        source: IngressSource,
        request: SessionResumeRequest,
        code: EventCode,
        detail: str,
        *,
        leader: int | None = None,
        last_applied: int = 0,
    ) -> None:
        view = self.view
        self.egress.reply(
            source,
            SessionEvent(
                cluster_session_id=request.cluster_session_id,
                correlation_id=request.correlation_id,
                leadership_term_id=view.leadership_term_id,
                leader_member_id=view.leader_member_id if leader is None else leader,
                code=code,
                version=protocol_version.PROTOCOL_VERSION,
                detail=detail,
                last_applied=last_applied,
            ),
        )
