"""Follower reads in the sans-IO core (:mod:`cluster.core.follower_reads`): a member
that is not the leader binds a query connection only for the holder of the session's
secret, holds a follower query until it has applied ``min_position`` and the session's
messages up to ``min_sequence``, answers it from its applied state on that connection,
keeps to the bounds, and drops what belongs to a session that closed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.core.base import ConsensusConfig, IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.core.follower_reads import MAX_LINKS_PER_SESSION, REPLACED, SESSION_GONE
from cluster.core.service_container import ServiceContainer
from cluster.core.session import secret_hash
from cluster.protocol.egress import QueryResponse, SessionEvent
from cluster.protocol.enums import CloseReason, EventCode, QueryStatus
from cluster.protocol.ingress import (
    QUERY_FOLLOWER,
    QUERY_LINEARIZABLE,
    QueryRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionMessageHeader,
    SessionResumeRequest,
)
from cluster.protocol.log import SessionCloseEvent, SessionOpenEvent
from cluster.service import Cluster, ClusteredService
from tests.unit.core_harness import Cluster as Members

SECRET = b"s" * 16
SESSION = 7


class Egress:
    """An EgressPort that keeps what goes to clients: ``(source or egress id, message)``."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, Any]] = []

    def connect(self, egress_id: int, channel: str) -> None:
        pass

    def attach(self, egress_id: int, source: Any) -> None:
        pass

    def send(self, egress_id: int, message: Any) -> bool:
        self.sent.append((egress_id, message))
        return True

    def reply(self, source: Any, message: Any) -> bool:
        self.sent.append((source, message))
        return True

    def close(self, egress_id: int) -> None:
        pass

    def to(self, target: Any) -> list[Any]:
        return [m for t, m in self.sent if t is target]


class Store(ClusteredService):
    def __init__(self) -> None:
        self.value = b"v0"

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        pass

    def on_take_snapshot(self) -> bytes:
        return self.value

    def on_query(self, payload: bytes) -> bytes:
        return self.value


@dataclass
class Progress:
    applied_sequence: int = 0
    told_sequence: int = 0
    replies: Any = None


@dataclass
class Follower:
    """Member 1 of 3, a follower, with session 7 open (from the log) and its service."""

    cm: ConsensusModule
    container: ServiceContainer
    egress: Egress
    progress: dict[int, Progress] = field(default_factory=dict)
    conn_ids: int = 0

    def connection(self) -> IngressSource:
        self.conn_ids += 1
        return IngressSource(self.conn_ids, "127.0.0.1")

    def send(self, source: IngressSource, *messages: Any) -> None:
        self.cm.on_batch([source, *messages], 0)

    def bind(self, source: IngressSource, secret: bytes = SECRET, session: int = SESSION) -> Any:
        self.send(source, SessionResumeRequest(99, session, 0, secret, query_only=True))
        return self.egress.to(source)[-1]

    def applied(self, position: int) -> list[QueryResponse]:
        """The service has applied up to ``position``: the answers it gives now."""
        before = len(self.egress.sent)
        self.cm.log.applied_position = position
        if self.cm.reads.answerable:
            self.container.answer_queries(position)
        return [m for _, m in self.egress.sent[before:] if isinstance(m, QueryResponse)]


def follower(**config: Any) -> Follower:
    egress = Egress()
    cm = ConsensusModule(ConsensusConfig(member_id=1, member_ids=(0, 1, 2), **config), egress)
    container = ServiceContainer(Store(), cm, egress, member_id=1, clock_ns=lambda: 0)
    f = Follower(cm, container, egress)
    cm.session_manager.sequencing.progress = f.progress.get
    open_session(f, SESSION)
    return f


def open_session(f: Follower, session_id: int) -> None:
    event = SessionOpenEvent(0, 1, session_id, 0, 0, "", b"", secret_hash(SECRET))
    f.cm.on_replay_log_message(event, 100, 0)
    f.progress[session_id] = Progress()


def query(
    correlation_id: int,
    *,
    position: int = 0,
    sequence: int = 0,
    session: int = SESSION,
    level: int = QUERY_FOLLOWER,
) -> QueryRequest:
    return QueryRequest(0, session, correlation_id, b"q", level, position, sequence)


def test_a_follower_answers_on_the_query_connection_once_applied_far_enough() -> None:
    f = follower()
    link = f.connection()
    ok = f.bind(link)
    assert isinstance(ok, SessionEvent)
    assert ok.code is EventCode.OK
    assert ok.session_secret == b""  # a query connection learns no secret
    assert f.cm.session_manager.holds_session(link)  # the ingress agent keeps it open
    assert link.trusted
    f.send(link, query(1, position=500))
    assert f.applied(100) == []  # held: the client has seen position 500
    assert f.applied(499) == []
    [answer] = f.applied(500)
    assert (answer.correlation_id, answer.status, answer.payload) == (1, QueryStatus.OK, b"v0")
    assert answer.log_position == 500  # the state it reflects
    assert f.egress.to(link)[-1] is answer  # on the query connection
    f.send(link, query(2, position=300))  # already applied that far: answered at once
    [answer] = f.applied(500)
    assert (answer.correlation_id, answer.log_position) == (2, 500)
    counters = f.cm.counters
    assert (counters.follower_queries, counters.queries, counters.read_rounds) == (2, 2, 0)
    assert len(f.cm.reads.follower) == 0


def test_a_follower_waits_for_the_sessions_own_messages() -> None:
    f = follower()
    link = f.connection()
    f.bind(link)
    f.send(link, query(1, sequence=3))  # the client was told its message 3 was applied
    assert f.applied(200) == []
    f.progress[SESSION].applied_sequence = 2
    assert f.applied(250) == []
    f.progress[SESSION].applied_sequence = 3
    [answer] = f.applied(300)
    assert answer.status is QueryStatus.OK


def test_strangers_get_nothing() -> None:
    f = follower()
    counters = f.cm.counters
    stranger = f.connection()
    f.send(stranger, query(1))  # no proof at all: dropped, counted, unanswered
    assert f.egress.to(stranger) == []
    assert counters.foreign_session_messages == 1
    wrong = f.bind(stranger, secret=b"x" * 16)
    assert wrong.code is EventCode.ERROR
    assert "secret" in wrong.detail
    assert counters.rejected_resumes == 1
    assert not f.cm.session_manager.holds_session(stranger)  # closed by the ingress agent
    f.send(stranger, query(2))
    assert f.applied(10_000) == []
    assert [m for m in f.egress.to(stranger) if isinstance(m, QueryResponse)] == []
    unknown = f.bind(f.connection(), session=8)  # not open here
    assert unknown.code is EventCode.CLOSED
    # bound to session 7, it may not ask for session 8 (open too)
    open_session(f, 8)
    link = f.connection()
    f.bind(link)
    f.send(link, query(3, session=8))
    assert f.applied(10_001) == []
    assert counters.foreign_session_messages == 3
    assert counters.follower_queries == 0


def test_a_query_connection_takes_nothing_but_queries() -> None:
    f = follower()
    link = f.connection()
    f.bind(link)
    counters = f.cm.counters
    before = counters.foreign_session_messages
    f.send(
        link,
        SessionKeepAlive(0, SESSION),
        SessionConnectRequest(5, 0, 1, ""),
        SessionResumeRequest(6, SESSION, 0, SECRET),  # a full resume: not on this one
        SessionMessageHeader(0, SESSION, 0, b"write", 1),
    )
    assert counters.foreign_session_messages == before + 3
    assert counters.wrong_term_messages == 1  # a follower takes no write (a leader: foreign)
    assert f.cm.session_manager.admission.holds(link) is False  # no session connecting
    assert f.egress.to(link)[-1].code is EventCode.OK  # nothing answered since the bind
    assert f.cm.sessions[SESSION].source is None  # never the session's connection


def test_a_linearizable_query_at_a_follower_is_told_to_ask_the_leader() -> None:
    f = follower()
    link = f.connection()
    f.bind(link)
    f.send(link, query(1, level=QUERY_LINEARIZABLE))
    [answer] = f.egress.to(link)[-1:]
    assert answer.status is QueryStatus.NOT_LEADER


def test_busy_past_the_bounds() -> None:
    f = follower(max_session_queries=2, max_queries=3)
    link = f.connection()
    f.bind(link)
    f.send(link, query(1, position=900), query(2, position=900), query(3, position=900))
    [busy] = [m for m in f.egress.to(link) if isinstance(m, QueryResponse)]
    assert (busy.correlation_id, busy.status) == (3, QueryStatus.BUSY)
    open_session(f, 8)
    other = f.connection()
    f.bind(other, session=8)
    f.send(other, query(4, session=8, position=900), query(5, session=8, position=900))
    [busy] = [m for m in f.egress.to(other) if isinstance(m, QueryResponse)]
    assert (busy.correlation_id, busy.status) == (5, QueryStatus.BUSY)  # the member's bound
    assert f.cm.counters.queries_refused == 2
    assert sorted(a.correlation_id for a in f.applied(900)) == [1, 2, 4]
    f.send(link, query(6, position=900))  # room again
    assert [a.correlation_id for a in f.applied(901)] == [6]


def test_a_closed_session_loses_its_queries_and_its_query_connections() -> None:
    f = follower()
    link = f.connection()
    f.bind(link)
    f.send(link, query(1, position=900))
    close = SessionCloseEvent(0, SESSION, 0, CloseReason.CLIENT_ACTION)
    f.cm.on_replay_log_message(close, 200, 0)
    assert f.applied(1000) == []  # dropped, not answered from a closed session
    assert f.cm.counters.queries_dropped == 1
    f.cm.on_slow_tick(0)
    told = f.egress.to(link)[-1]
    assert (told.code, told.detail) == (EventCode.CLOSED, SESSION_GONE)
    assert not f.cm.session_manager.holds_session(link)  # so the ingress agent closes it
    f.send(link, query(2))
    assert f.applied(1001) == []
    again = f.bind(f.connection())
    assert again.code is EventCode.CLOSED
    assert again.detail == "CLIENT_ACTION"


def test_a_closed_connection_is_unbound_and_its_queries_dropped() -> None:
    f = follower()
    link = f.connection()
    f.bind(link)
    f.send(link, query(1, position=900))
    assert f.applied(100) == []  # held
    assert not f.cm.reads.answerable  # nothing to look at again until more is applied
    f.cm.session_manager.on_source_closed(link)
    assert not f.cm.session_manager.holds_session(link)
    assert f.cm.reads.answerable  # dropped at the next look, applied more or not
    assert f.applied(100) == []
    assert f.cm.counters.queries_dropped == 1
    assert len(f.cm.reads.follower) == 0


def test_a_session_holds_few_query_connections_on_a_member() -> None:
    f = follower()
    links = [f.connection() for _ in range(MAX_LINKS_PER_SESSION + 1)]
    for link in links:
        assert f.bind(link).code is EventCode.OK
    oldest = links[0]
    told = f.egress.to(oldest)[-1]
    assert (told.code, told.detail) == (EventCode.CLOSED, REPLACED)
    assert not f.cm.session_manager.holds_session(oldest)
    assert len(f.cm.reads.links) == MAX_LINKS_PER_SESSION


def test_a_query_on_the_sessions_own_connection_is_answered_on_its_egress() -> None:
    f = follower()
    own = f.connection()
    f.cm.sessions[SESSION].source = own  # (as at its leader)
    assert f.bind(own).code is EventCode.OK
    assert not f.cm.reads.links.holds(own)  # never a query connection too
    f.send(own, query(1, position=150))
    [answer] = f.applied(150)
    assert answer.status is QueryStatus.OK
    assert f.egress.sent[-1] == (SESSION, answer)  # the session's egress
    f.send(own, SessionKeepAlive(0, SESSION))  # its requests are still its own
    assert f.cm.counters.foreign_session_messages == 0


def test_the_leader_answers_follower_queries_from_its_applied_state_without_a_round() -> None:
    c = Members(3, seed=3)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    event = SessionOpenEvent(term, 1, SESSION, 0, 0, "", b"", secret_hash(SECRET))
    leader.session_manager.mirror(event, leader.commit_position, c.now)
    link = IngressSource(1, "127.0.0.1")
    rounds, end = leader.counters.read_rounds, leader.log.published_position
    leader.on_batch(
        [
            link,
            SessionResumeRequest(9, SESSION, 0, SECRET, query_only=True),
            SessionMessageHeader(term, SESSION, 0, b"write", 1),  # not on this connection
            QueryRequest(term, SESSION, 1, b"q", QUERY_FOLLOWER, leader.commit_position),
        ],
        c.now,
    )
    assert leader.counters.foreign_session_messages == 1
    c.persist(me)
    assert [(q.correlation_id, at) for q, at in c.answered[me]] == [(1, leader.commit_position)]
    assert leader.counters.read_rounds == rounds  # no read round
    assert leader.log.published_position == end  # nothing appended
