"""Linearizable queries without the log: Raft's ReadIndex (section 6.4), in positions.

A query (:class:`~cluster.protocol.ingress.QueryRequest`) reads the service's state and
changes nothing, so it need not be appended, replicated or fsynced.  It must still see
every write that completed before it was sent, and nothing a deposed leader alone
holds.  The leader answers it in three steps:

1. **Read index.**  When the query arrives, the leader records its commit position: every
   write acknowledged before the query was sent is at or below it.  A new leader takes
   no query into a round until it has committed (and applied) the first entry of its own
   term (its election's NewLeadershipTermEvent: :attr:`ConsensusModule.is_ready_leader`):
   before that its commit position may lag what an earlier leader acknowledged.
2. **Read round.**  The leader confirms it still leads: a round of heartbeats that
   began *after* the query arrived (the commit heartbeat, a
   :class:`~cluster.protocol.consensus.CommitPosition` carrying the round's number)
   must be answered by a quorum of voting members, the leader included, in its term (an
   :class:`~cluster.protocol.consensus.AppendPosition` carrying the number back).  A
   member that has moved to a later term does not answer in this one: a leader that was
   paused or cut off and replaced never completes a round (it is told the later term
   and steps down, and its queries are answered NOT_LEADER: the client asks the new
   leader).  Rounds are numbered 1, 2, 3... and a member's answer to round ``r``
   answers every round before it (it was sent after them); a round is confirmed once a
   quorum's highest answers reach it (:func:`~cluster.core.quorum.committed`, as
   etcd-io/raft's ``readOnly`` counts).  One round is in flight at a time: the queries
   that arrive while it is share the next, begun as soon as it ends (a batch:
   :meth:`ReadIndex.start_round`, once per duty cycle).
3. **Answer.**  Once its round is confirmed and the service has applied the log up to
   the read index, the query is answered from the service's state
   (:meth:`~cluster.core.service_container.ServiceContainer.answer_queries`, called by
   the driver after it applies: :func:`cluster.core.driver.drive`).

**Bounds.**  A session has at most ``max_session_queries`` queries in flight here, a
member ``max_queries``; one past either is answered BUSY at once (the client waits
and asks again).  Queries never enter the log, so they hold no log room, no disk and no
replication from writes; their cost is one heartbeat to each follower per round.

Everything here is the leader's: on any other member a linearizable query is answered
NOT_LEADER, and a leader that steps down answers every linearizable query it holds so.
Follower-consistency queries are any member's (:mod:`cluster.core.follower_reads`:
:attr:`ReadIndex.follower`); the two kinds share the bounds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..protocol.egress import QueryResponse
from ..protocol.enums import QueryStatus
from ..protocol.ingress import QUERY_FOLLOWER, QUERY_LINEARIZABLE, QueryRequest
from . import quorum
from .base import ConsensusConfig, Counters, EgressPort, IngressSource, TermView
from .follower_reads import FollowerReads, QueryLinks
from .replication import LeaderReplication
from .session import ClusterSession, State


class Query:
    """One query held by the leader until it is answered."""

    __slots__ = ("correlation_id", "payload", "read_index", "round", "session_id", "source")

    def __init__(
        self,
        session_id: int,
        correlation_id: int,
        payload: bytes,
        read_index: int,
        source: IngressSource | None = None,
    ) -> None:
        self.session_id = session_id
        self.source = source
        """The connection it came on (a refusal goes back there)."""
        self.correlation_id = correlation_id
        self.payload = payload
        self.read_index = read_index
        """The commit position it must see applied (-1: not yet recorded, a leader
        that is not ready yet)."""
        self.round = 0
        """The read round that confirms it (0: none has begun since it arrived)."""

    def __repr__(self) -> str:
        return (
            f"Query(session={self.session_id}, id={self.correlation_id}, "
            f"index={self.read_index}, round={self.round})"
        )


class ReadIndex:
    """The leader's queries: waiting for a round, in a round, and confirmed."""

    __slots__ = (
        "_acks",
        "_per_session",
        "_round_sent_ns",
        "_unsent",
        "_waiting",
        "config",
        "counters",
        "egress",
        "follower",
        "links",
        "log",
        "progress",
        "ready",
        "replication",
        "round",
        "rounds_confirmed",
        "sessions",
        "view",
    )

    def __init__(
        self,
        config: ConsensusConfig,
        view: TermView,
        replication: LeaderReplication,
        sessions: dict[int, ClusterSession],
        egress: EgressPort,
        counters: Counters,
        links: QueryLinks | None = None,
        applied_sequence: Callable[[int], int] = lambda session_id: 0,
    ) -> None:
        self.config = config
        self.view = view
        self.replication = replication
        self.log = replication.log
        self.progress = replication.progress
        self.sessions = sessions
        """The open sessions (the session manager's table, read only)."""
        self.egress = egress
        self.counters = counters
        self.round = 0
        """The number of the latest read round this member began (it only grows)."""
        self.rounds_confirmed = 0
        """The latest round a quorum answered, in this term."""
        self._acks: dict[int, int] = {}
        """Per follower, the latest round it answered in this leader's term."""
        self._unsent: list[Query] = []
        """Arrived since the last round began."""
        self._waiting: deque[Query] = deque()
        """In a round not yet confirmed, in round order."""
        self.ready: deque[Query] = deque()
        """Confirmed, waiting for the service to apply up to their read index (in read
        index order: rounds and commit positions only grow)."""
        self._per_session: dict[int, int] = {}
        self._round_sent_ns = 0
        if links is None:  # (tests of this part alone)
            links = QueryLinks(config, egress, view, counters, sessions)
        self.links = links
        """The sessions' query connections (the session manager's)."""
        self.follower = FollowerReads(
            *(config, view, self.log, sessions, self.links, applied_sequence),
            *(egress, counters, self),
        )
        """This member's follower-consistency queries (any member answers them)."""

    def __len__(self) -> int:
        return len(self._unsent) + len(self._waiting) + len(self.ready)

    def in_flight(self, session_id: int) -> int:
        """Linearizable queries of ``session_id`` held here."""
        return self._per_session.get(session_id, 0)

    @property
    def answerable(self) -> bool:
        """Whether the driver should answer queries now (:meth:`take_answerable`, and
        the follower queries' :meth:`FollowerReads.take_answerable`)."""
        return bool(self.ready) or self.follower.due

    # ------------------------------------------------------------------ arrival

    def add(
        self,
        session_id: int,
        correlation_id: int,
        payload: bytes,
        *,
        ready: bool,
        source: IngressSource | None = None,
    ) -> QueryStatus | None:
        """Hold a query of an open session that arrived at this leader (``ready``: it
        has committed an entry of its term); BUSY past the bounds (not held)."""
        per_session = self._per_session.get(session_id, 0)
        follower = self.follower
        if (
            per_session + follower.in_flight(session_id) >= self.config.max_session_queries
            or len(self) + len(follower) >= self.config.max_queries
        ):
            return QueryStatus.BUSY
        self._per_session[session_id] = per_session + 1
        read_index = self.log.commit_position if ready else -1
        self._unsent.append(Query(session_id, correlation_id, payload, read_index, source))
        return None

    def on_query(self, msg: QueryRequest, source: IngressSource | None, now_ns: int) -> None:
        """A client's query.  A follower-consistency one goes to :attr:`follower` (any
        member answers it).  A linearizable one is taken only from a connection that
        holds its session (its own, or a query connection of it: anything else is
        dropped and counted); held if this member leads (until it has committed an
        entry of its term, without a read index), else answered at once NOT_LEADER
        (naming the leader it knows), BUSY past a bound, REFUSED at an unknown
        consistency."""
        if msg.consistency == QUERY_FOLLOWER:
            self.follower.on_query(msg, source)
            return
        session = self.sessions.get(msg.cluster_session_id)
        if (
            session is None
            or source is None
            or (
                session.source is not source
                and self.links.session_of(source) != session.cluster_session_id
            )
        ):
            self.counters.foreign_session_messages += 1
            return
        if session.state is not State.OPEN:
            return
        session.time_of_last_activity_ns = now_ns
        view = self.view
        leader = view.leader_member_id
        session_id, correlation_id = msg.cluster_session_id, msg.correlation_id
        if msg.consistency != QUERY_LINEARIZABLE:
            message, status = f"unknown consistency {msg.consistency}", QueryStatus.REFUSED
        elif leader != self.config.member_id:
            message, status = "this member does not lead: ask the leader", QueryStatus.NOT_LEADER
        else:
            busy = self.add(
                session_id, correlation_id, msg.payload, ready=view.is_ready_leader, source=source
            )
            if busy is None:
                return
            status = busy
            config = self.config
            message = (
                f"too many queries in flight (at most {config.max_session_queries} per "
                f"session, {config.max_queries} per member): try again later"
            )
        self.counters.queries_refused += 1
        self.refuse(session_id, correlation_id, status, message, leader, source)

    def start_round(self, now_ns: int) -> bool:
        """A ready leader's cycle: begin a round for the queries that arrived since the
        last one began (each arrived before it: it confirms them), on the commit
        heartbeat to every follower; True if one began.  One round is in flight at a
        time: the queries that arrive meanwhile wait for it to end and share the next
        (under load a round serves many queries, and costs each follower one wake-up).
        A round unanswered for a heartbeat interval (a message lost with a link) is
        sent again, or overtaken by a new one: an answer to a later round answers it."""
        unsent = self._unsent
        if self._waiting:
            if now_ns - self._round_sent_ns < self.config.leader_heartbeat_interval_ns:
                return False
            if not unsent:
                self._round_sent_ns = now_ns
                self.replication.send_commit_position(every=True, read_round=self.round)
                return False
        elif not unsent:
            return False
        self._round_sent_ns = now_ns
        self.round += 1
        self.counters.read_rounds += 1
        number = self.round
        commit = self.log.commit_position
        for query in unsent:
            query.round = number
            if query.read_index < 0:  # arrived before this leader was ready
                query.read_index = commit
        self._waiting.extend(unsent)
        unsent.clear()
        self.replication.send_commit_position(every=True, read_round=number)
        self._advance()  # a cluster of one confirms it at once
        return True

    # ------------------------------------------------------------------ answers

    def on_ack(self, member_id: int, read_round: int) -> None:
        """A follower answered ``read_round`` in this leader's term (its report was
        taken: the consensus module checked term and sender)."""
        if read_round > self._acks.get(member_id, 0):
            if read_round > self.round:
                return  # a round never begun here: forged or from another life
            self._acks[member_id] = read_round
            self._advance()

    def _advance(self) -> None:
        """Confirm every round a quorum of voting members has answered (the leader
        answers its own at once; a catch-up member counts for none)."""
        if not self._waiting:
            return
        answered = [self.round]
        for progress in self.progress:
            answered.append(self._acks.get(progress.member_id, 0) if progress.voter else 0)
        confirmed = quorum.committed(answered, self.config.member_count)
        if confirmed <= self.rounds_confirmed:
            return
        self.rounds_confirmed = confirmed
        waiting, ready = self._waiting, self.ready
        while waiting and waiting[0].round <= confirmed:
            ready.append(waiting.popleft())

    def take_answerable(self, applied: int) -> list[Query]:
        """The confirmed queries whose read index the service has applied (they are
        answered now: no longer held)."""
        ready = self.ready
        taken: list[Query] = []
        while ready and ready[0].read_index <= applied:
            query = ready.popleft()
            self._release(query.session_id)
            taken.append(query)
        return taken

    def _release(self, session_id: int) -> None:
        count = self._per_session.get(session_id, 0) - 1
        if count > 0:
            self._per_session[session_id] = count
        else:
            self._per_session.pop(session_id, None)

    # ------------------------------------------------------------------ terms

    def new_term(self) -> None:
        """This member leads a new term: no follower has answered a round in it."""
        self._acks.clear()
        self.rounds_confirmed = 0

    def step_down(self, leader_member_id: int) -> int:
        """This member no longer leads: every query it holds is answered NOT_LEADER
        (the client asks the leader); returns how many."""
        held = [*self._unsent, *self._waiting, *self.ready]
        self._unsent.clear()
        self._waiting.clear()
        self.ready.clear()
        self._per_session.clear()
        self._acks.clear()
        self.rounds_confirmed = 0
        for query in held:
            self.refuse(
                query.session_id,
                query.correlation_id,
                QueryStatus.NOT_LEADER,
                "this member no longer leads: ask the leader",
                leader_member_id,
                query.source,
            )
        return len(held)

    def refuse(
        self,
        session_id: int,
        correlation_id: int,
        status: QueryStatus,
        message: str,
        leader_member_id: int = -1,
        source: IngressSource | None = None,
    ) -> None:
        """Answer a query with ``status`` instead of the service's answer: on the
        connection it came on while that is open (a member that has just stepped down
        has closed the sessions' egress), else on the session's egress."""
        response = QueryResponse(
            session_id,
            correlation_id,
            self.view.leadership_term_id,
            status,
            self.log.applied_position,
            message=message,
            leader_member_id=leader_member_id,
        )
        if source is not None and not source.closed:
            self.egress.reply(source, response)
        else:
            self.egress.send(session_id, response)
