"""Follower reads: any member answers a session's follower-consistency queries from the
state it has applied, without a read round (``docs/queries.md``).

A follower-consistency :class:`~cluster.protocol.ingress.QueryRequest` names how fresh
its answer must be: ``min_position``, the highest log position an answer this client
got reflected, and ``min_sequence``, the highest of the session's own messages the
client was told were applied.  Every member applies the same log in the same order, so
the state at a log position is the same on every member: a member that has applied at
least ``min_position``, and the session's messages up to ``min_sequence``, answers
with a state no older than anything the client has seen (it never goes back in time
for one client, and reads its own writes).  Until it has, the query is held
(:class:`FollowerReads`), and answered after the driver applies, as the leader's
linearizable ones are (:meth:`ServiceContainer.answer_queries
<cluster.core.service_container.ServiceContainer.answer_queries>`).  The answer's
``log_position`` is the applied position it reflects.

**Query connections** (:class:`QueryLinks`).  A session's own connection goes to its
leader; to ask another member, the client opens a connection there and proves it holds
the session: a :class:`~cluster.protocol.ingress.SessionResumeRequest` with
``query_only`` and the session's secret, checked against the ``secret_hash`` every
member has from the log (:meth:`SessionResumption.on_resume
<cluster.core.resumption.SessionResumption.on_resume>`).  The member then binds the
connection to the session as a *query connection*: it never becomes the session's
connection (the session stays where it is), the member takes nothing but queries from
it (anything else is dropped and counted as a foreign message), and once the session
is no longer open here (closed, by the log) the binding goes, the connection is told
CLOSED and, holding no session, is closed by the ingress agent.  A connection that
proves nothing holds nothing: a query on it, naming whatever session, is dropped and
counted, never answered.  At most :data:`MAX_LINKS_PER_SESSION` query connections per
session on a member (a client opens one per member; a newer one replaces the oldest,
which may be half-open), so at most that many times ``max_concurrent_sessions`` per
member.

**Bounds.**  Held follower queries count with the linearizable ones against
``max_session_queries`` and ``max_queries`` (:class:`~cluster.core.reads.ReadIndex`);
one past either is answered BUSY at once (the client asks another member).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..protocol import version as protocol_version
from ..protocol.egress import QueryResponse, SessionEvent
from ..protocol.enums import EventCode, QueryStatus
from ..protocol.ingress import QueryRequest, SessionResumeRequest
from .base import ConsensusConfig, Counters, EgressPort, IngressSource, TermView
from .log import ReplicatedLog
from .session import ClusterSession, State

MAX_LINKS_PER_SESSION = 4
"""Query connections one session may hold on one member; a newer one replaces the
oldest (told CLOSED: :data:`REPLACED`)."""

REPLACED = "replaced by a newer query connection"
SESSION_GONE = "the session is not open on this member"


class QueryLinks:
    """The query connections of this member's open sessions (see the module)."""

    __slots__ = (
        "_by_session",
        "_links",
        "config",
        "counters",
        "egress",
        "on_unbound",
        "sessions",
        "view",
    )

    def __init__(
        self,
        config: ConsensusConfig,
        egress: EgressPort,
        view: TermView,
        counters: Counters,
        sessions: dict[int, ClusterSession],
    ) -> None:
        self.config = config
        self.egress = egress
        self.view = view
        self.counters = counters
        self.sessions = sessions
        """The session manager's open sessions (read only)."""
        self._links: dict[IngressSource, int] = {}
        """Each query connection and the session it is bound to."""
        self._by_session: dict[int, list[IngressSource]] = {}
        """Each session's query connections, oldest first."""
        self.on_unbound: Callable[[], None] = lambda: None
        """Called when connections were unbound (their held queries are to be dropped:
        :meth:`FollowerReads.look_again`)."""

    def __len__(self) -> int:
        return len(self._links)

    def session_of(self, source: IngressSource | None) -> int:
        """The session ``source`` is a query connection of (-1: none)."""
        if source is None:
            return -1
        return self._links.get(source, -1)

    def holds(self, source: IngressSource) -> bool:
        """Whether ``source`` is a query connection (it holds a session: the ingress
        agent keeps it open)."""
        return source in self._links

    def refuses(self, message: object, source: IngressSource) -> bool:
        """A session request on ``source``: True (counted, to be dropped) if ``source``
        is a query connection and ``message`` is not another query-only resume."""
        if source not in self._links:
            return False
        if isinstance(message, SessionResumeRequest) and message.query_only:
            return False
        self.counters.foreign_session_messages += 1
        return True

    def bind(
        self, session: ClusterSession, request: SessionResumeRequest, source: IngressSource
    ) -> None:
        """Bind ``source`` (which proved it holds ``session``) as its query connection,
        replacing the oldest past :data:`MAX_LINKS_PER_SESSION`; answered OK."""
        session_id = session.cluster_session_id
        bound = self._links.get(source)
        if session.source is source:  # its own connection carries its queries already
            self._tell(source, request.correlation_id, session_id, EventCode.OK, "own connection")
            return
        if bound is not None and bound != session_id:
            self.counters.foreign_session_messages += 1
            self._tell(source, request.correlation_id, bound, EventCode.ERROR, "bound elsewhere")
            return
        if bound is None:
            links = self._by_session.setdefault(session_id, [])
            while len(links) >= MAX_LINKS_PER_SESSION:
                old = links.pop(0)
                del self._links[old]
                self._tell(old, 0, session_id, EventCode.CLOSED, REPLACED)
            links.append(source)
            self._links[source] = session_id
        source.trusted = True  # it may send frames as large as its session's
        self._tell(source, request.correlation_id, session_id, EventCode.OK, "query connection")

    def on_source_closed(self, source: IngressSource) -> None:
        """A connection closed: if it was a query connection, it is one no more."""
        session_id = self._links.pop(source, None)
        if session_id is None:
            return
        self.on_unbound()
        links = self._by_session.get(session_id)
        if links is not None:
            if source in links:
                links.remove(source)
            if not links:
                del self._by_session[session_id]

    def sweep(self) -> int:
        """Unbind the query connections of sessions no longer open here (every slow
        tick): each is told CLOSED and, holding no session, is closed by the ingress
        agent.  Returns how many."""
        sessions = self.sessions
        gone = [
            session_id
            for session_id in self._by_session
            if (session := sessions.get(session_id)) is None or session.state is not State.OPEN
        ]
        count = 0
        for session_id in gone:
            for source in self._by_session.pop(session_id):
                del self._links[source]
                if not source.closed:
                    self._tell(source, 0, session_id, EventCode.CLOSED, SESSION_GONE)
                count += 1
        if count:
            self.on_unbound()
        return count

    def _tell(
        self,
        source: IngressSource,
        correlation_id: int,
        session_id: int,
        code: EventCode,
        detail: str,
    ) -> None:
        view = self.view
        self.egress.reply(
            source,
            SessionEvent(
                cluster_session_id=session_id,
                correlation_id=correlation_id,
                leadership_term_id=view.leadership_term_id,
                leader_member_id=view.leader_member_id,
                code=code,
                version=protocol_version.PROTOCOL_VERSION,
                detail=detail,
            ),
        )


class FollowerQuery:
    """A follower-consistency query held until this member has applied far enough."""

    __slots__ = (
        "correlation_id",
        "min_position",
        "min_sequence",
        "on_link",
        "payload",
        "session_id",
        "source",
    )

    def __init__(self, msg: QueryRequest, source: IngressSource, *, on_link: bool) -> None:
        self.session_id = msg.cluster_session_id
        self.correlation_id = msg.correlation_id
        self.payload = msg.payload
        self.min_position = msg.min_position
        self.min_sequence = msg.min_sequence
        self.source = source
        self.on_link = on_link
        """It came on a query connection (answered there; else on the session's egress)."""

    def __repr__(self) -> str:
        return (
            f"FollowerQuery(session={self.session_id}, id={self.correlation_id}, "
            f"position={self.min_position}, sequence={self.min_sequence})"
        )


class HeldElsewhere(Protocol):
    """The linearizable queries this member holds (:class:`~cluster.core.reads.ReadIndex`),
    which share the bounds."""

    def __len__(self) -> int: ...

    def in_flight(self, session_id: int) -> int: ...


class FollowerReads:
    """The follower-consistency queries this member holds (see the module)."""

    __slots__ = (
        "_per_session",
        "_scanned_at",
        "applied_sequence",
        "config",
        "counters",
        "egress",
        "held",
        "linearizable",
        "links",
        "log",
        "sessions",
        "view",
    )

    def __init__(
        self,
        config: ConsensusConfig,
        view: TermView,
        log: ReplicatedLog,
        sessions: dict[int, ClusterSession],
        links: QueryLinks,
        applied_sequence: Callable[[int], int],
        egress: EgressPort,
        counters: Counters,
        linearizable: HeldElsewhere,
    ) -> None:
        self.config = config
        self.view = view
        self.log = log
        self.sessions = sessions
        self.links = links
        self.applied_sequence = applied_sequence
        """The highest sequence of a session's messages the service applied."""
        self.egress = egress
        self.counters = counters
        self.linearizable = linearizable
        self.held: list[FollowerQuery] = []
        """Waiting for this member to apply far enough, in arrival order."""
        self._per_session: dict[int, int] = {}
        self._scanned_at = -1
        """The applied position of the last look at :attr:`held` that found them all
        waiting (-1: look again: a query arrived, or a connection went, since)."""
        links.on_unbound = self.look_again

    def __len__(self) -> int:
        return len(self.held)

    def in_flight(self, session_id: int) -> int:
        """Follower queries of ``session_id`` held here."""
        return self._per_session.get(session_id, 0)

    def on_query(self, msg: QueryRequest, source: IngressSource | None) -> None:
        """A follower-consistency query: taken only from a connection that holds the
        session (a query connection of it, or its own connection), else dropped and
        counted; held until answerable (BUSY past the bounds)."""
        session_id = msg.cluster_session_id
        session = self.sessions.get(session_id)
        on_link = self.links.session_of(source) == session_id
        if source is None or session is None or not (on_link or session.source is source):
            self.counters.foreign_session_messages += 1
            return
        if session.state is not State.OPEN:
            return  # closing: its query connections go at the next sweep
        config, others = self.config, self.linearizable
        per_session = self._per_session.get(session_id, 0)
        if (
            per_session + others.in_flight(session_id) >= config.max_session_queries
            or len(self.held) + len(others) >= config.max_queries
        ):
            self.counters.queries_refused += 1
            message = (
                f"too many queries in flight (at most {config.max_session_queries} per "
                f"session, {config.max_queries} per member): try again later"
            )
            response = QueryResponse(
                session_id,
                msg.correlation_id,
                self.view.leadership_term_id,
                QueryStatus.BUSY,
                self.log.applied_position,
                message=message,
                leader_member_id=self.view.leader_member_id,
            )
            if on_link:
                self.egress.reply(source, response)
            else:
                self.egress.send(session_id, response)
            return
        self._per_session[session_id] = per_session + 1
        self.held.append(FollowerQuery(msg, source, on_link=on_link))
        self._scanned_at = -1

    def look_again(self) -> None:
        """Held queries may have lost their connection: the next look drops them."""
        if self.held:
            self._scanned_at = -1

    @property
    def due(self) -> bool:
        """Whether a look at the held queries may find one to answer (or to drop): one
        arrived, or the service applied more, since the last look."""
        return bool(self.held) and self._scanned_at != self.log.applied_position

    def take_answerable(self, applied: int) -> list[FollowerQuery]:
        """The held queries this member may answer now, having applied the log up to
        ``applied`` (no longer held).  Those whose session is no longer open here, or
        whose connection closed, are dropped (counted in ``queries_dropped``)."""
        if not self.held or self._scanned_at == applied:
            return []
        sessions, applied_sequence = self.sessions, self.applied_sequence
        taken: list[FollowerQuery] = []
        still: list[FollowerQuery] = []
        for query in self.held:
            session = sessions.get(query.session_id)
            if session is None or session.state is not State.OPEN or query.source.closed:
                self.counters.queries_dropped += 1
                self._release(query.session_id)
            elif query.min_position <= applied and (
                query.min_sequence <= 0 or query.min_sequence <= applied_sequence(query.session_id)
            ):
                self._release(query.session_id)
                taken.append(query)
            else:
                still.append(query)
        self.held = still
        self._scanned_at = applied
        return taken

    def _release(self, session_id: int) -> None:
        count = self._per_session.get(session_id, 0) - 1
        if count > 0:
            self._per_session[session_id] = count
        else:
            self._per_session.pop(session_id, None)

    def send(self, query: FollowerQuery, response: QueryResponse) -> None:
        """The answer to ``query``: on the query connection it came on, else on its
        session's egress (it came on the session's own connection, at the leader)."""
        if query.on_link:
            self.egress.reply(query.source, response)
        else:
            self.egress.send(query.session_id, response)
