"""Linearizable queries in the sans-IO core (ReadIndex, :mod:`cluster.core.reads`).

Three pure consensus modules on the unit harness's network: a query is answered only
after a read round that began after it arrived is answered by a quorum in the
leader's term, and once the log is applied up to the commit position it recorded;
queries of one cycle share a round; a new leader takes none into a round before it has
committed an entry of its term; a deposed leader never answers.
"""

from __future__ import annotations

from typing import Any

from cluster.core.reads import Query
from cluster.protocol.consensus import AppendPosition, CommitPosition
from cluster.protocol.egress import QueryResponse
from cluster.protocol.enums import QueryStatus, Role
from tests.unit.core_harness import MS, SECOND, Cluster


class Recorder:
    """An EgressPort that keeps what the core sends clients."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, Any]] = []

    def connect(self, egress_id: int, channel: str) -> None:
        pass

    def send(self, egress_id: int, message: Any) -> bool:
        self.sent.append((egress_id, message))
        return True

    def reply(self, source: Any, message: Any) -> bool:
        self.sent.append((message.cluster_session_id, message))
        return True

    def close(self, egress_id: int) -> None:
        pass


def answered(c: Cluster, member: int) -> list[int]:
    return [query.correlation_id for query, _ in c.answered[member]]


def deliver(c: Cluster, *, only: type | None = None) -> int:
    """Hand every queued member message to its receiver once (what a step does, without
    the ticks); returns how many."""
    queue, c.net.queue = c.net.queue, []
    count = 0
    for sender, receiver, message in queue:
        if receiver in c.down or sender in c.down:
            continue
        if only is not None and not isinstance(message, only):
            c.net.queue.append((sender, receiver, message))
            continue
        c.members[receiver].on_consensus_message(message, c.now)
        c.persist(receiver)
        count += 1
    return count


def test_queries_of_one_cycle_share_one_round_and_are_answered_at_their_read_index() -> None:
    c = Cluster(3, seed=1)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    reads = leader.reads
    before = reads.round
    commit = leader.commit_position
    for correlation_id in (1, 2, 3):
        assert reads.add(7, correlation_id, b"q", ready=True) is None
    assert [q.read_index for q in reads._unsent] == [commit] * 3  # recorded on arrival
    leader.consensus_work(c.now)
    assert reads.round == before + 1  # one round for the three
    rounds = [m for _, _, m in c.net.queue if isinstance(m, CommitPosition) and m.read_round]
    assert len(rounds) == 2
    assert {m.read_round for m in rounds} == {reads.round}
    assert answered(c, me) == []  # not before a quorum answered the round
    deliver(c)  # the followers answer it
    replies = [m for _, _, m in c.net.queue if isinstance(m, AppendPosition) and m.read_round]
    assert len(replies) == 2
    assert {m.read_round for m in replies} == {reads.round}
    deliver(c)
    assert answered(c, me) == [1, 2, 3]
    assert all(applied >= commit for _, applied in c.answered[me])
    assert len(reads) == 0
    assert reads.in_flight(7) == 0
    assert leader.log.published_position == commit  # no log entry for a query


def test_one_follower_answering_is_a_quorum_of_three() -> None:
    c = Cluster(3, seed=2)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    _one, other = leader.config.others
    c.net.cut |= {(me, other), (other, me)}
    leader.reads.add(7, 1, b"q", ready=True)
    leader.consensus_work(c.now)
    deliver(c)
    deliver(c)
    assert answered(c, me) == [1]


def test_a_round_that_began_before_the_query_does_not_confirm_it() -> None:
    c = Cluster(3, seed=3)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    reads = leader.reads
    reads.add(7, 1, b"first", ready=True)
    leader.consensus_work(c.now)  # round r begins
    first_round = reads.round
    reads.add(7, 2, b"second", ready=True)  # arrives while round r is on its way
    deliver(c)  # followers answer round r
    deliver(c, only=AppendPosition)  # the leader gets the answers: no cycle in between
    assert answered(c, me) == [1]
    assert [q.correlation_id for q in reads._unsent] == [2]  # waits for a later round
    leader.consensus_work(c.now)
    assert reads.round == first_round + 1
    deliver(c)
    deliver(c)
    assert answered(c, me) == [1, 2]


def test_one_round_is_in_flight_and_the_next_takes_all_that_waited() -> None:
    c = Cluster(3, seed=12)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    reads = leader.reads
    reads.add(7, 1, b"q", ready=True)
    leader.consensus_work(c.now)
    first = reads.round
    reads.add(7, 2, b"q", ready=True)
    reads.add(8, 3, b"q", ready=True)
    leader.consensus_work(c.now)
    assert reads.round == first  # waits for the round in flight
    deliver(c)
    deliver(c)
    assert answered(c, me) == [1]
    leader.consensus_work(c.now)
    assert reads.round == first + 1  # one round for both
    deliver(c)
    deliver(c)
    assert answered(c, me) == [1, 2, 3]


def test_a_lost_round_is_sent_again_after_a_heartbeat_interval() -> None:
    c = Cluster(3, seed=13)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    reads = leader.reads
    reads.add(7, 1, b"q", ready=True)
    leader.consensus_work(c.now)
    number = reads.round
    c.net.queue.clear()  # lost with the links
    c.now += leader.config.leader_heartbeat_interval_ns // 2
    leader.consensus_work(c.now)
    assert c.net.queue == []  # not yet
    c.now += leader.config.leader_heartbeat_interval_ns
    leader.consensus_work(c.now)
    again = {m.read_round for _, _, m in c.net.queue if isinstance(m, CommitPosition)}
    assert again == {number}  # the same round: nothing arrived since it began
    deliver(c)
    deliver(c)
    assert answered(c, me) == [1]


def test_answers_wait_for_the_service_to_apply_the_read_index() -> None:
    c = Cluster(3, seed=4)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    c.lagging.add(me)  # the service lags behind the commit position
    c.applied[me] = 0
    leader.reads.add(7, 1, b"q", ready=True)
    leader.consensus_work(c.now)
    deliver(c)
    deliver(c)
    assert answered(c, me) == []
    assert len(leader.reads.ready) == 1
    c.lagging.clear()
    c.step()  # the shell applies up to the commit position, then answers
    assert answered(c, me) == [1]
    query, applied = c.answered[me][0]
    assert applied >= query.read_index == leader.commit_position


def test_a_new_leader_answers_nothing_before_it_commits_an_entry_of_its_term() -> None:
    c = Cluster(3, seed=5)
    c.run_until(lambda: any(cm.role is Role.LEADER for cm in c.members.values()))
    leader = next(cm for cm in c.members.values() if cm.role is Role.LEADER)
    assert not leader.is_ready_leader  # its term's first entry is not committed yet
    me = leader.config.member_id
    leader.reads.add(7, 1, b"q", ready=leader.is_ready_leader)
    leader.consensus_work(c.now)
    assert leader.reads.round == 0  # no round before it is ready
    assert leader.reads._unsent[0].read_index == -1
    c.run_until(lambda: answered(c, me) == [1])
    query = c.answered[me][0][0]
    assert query.read_index >= leader.ready_position  # its term's first entry included


def test_a_paused_leader_replaced_meanwhile_never_answers() -> None:
    """SIGSTOP the leader, a new leader is elected and commits a write, SIGCONT: a
    query at the old leader at once is never answered from its old state; its round
    reaches members of the later term, which tell it so: it steps down and answers
    NOT_LEADER (its client asks the new leader)."""
    c = Cluster(3, seed=6)
    old = c.leader_with_a_committed_entry()
    me = old.config.member_id
    old_term = old.leadership_term_id
    c.down.add(me)  # paused: no ticks, no messages
    c.run_until(lambda: (new := c.leader()) is not None and new.leadership_term_id > old_term)
    end = c.append(b"new value")
    c.run_until(lambda: all(c.members[i].commit_position >= end for i in old.config.others))
    c.down.discard(me)  # SIGCONT: it still thinks it leads its term
    assert old.role is Role.LEADER
    assert old.is_ready_leader
    recorder = Recorder()
    old.reads.egress = recorder
    c.now += 3 * SECOND  # the time it was paused for
    old.reads.add(7, 1, b"q", ready=True)
    old.consensus_work(c.now)  # its round goes out (before any tick of its own)
    c.persist(me)  # the shell's drive: nothing to answer yet
    assert old.reads.round > 0
    assert answered(c, me) == []
    deliver(c)  # the members of the later term answer with their term
    deliver(c)
    assert answered(c, me) == []
    assert old.role is not Role.LEADER
    [(session, response)] = recorder.sent
    assert isinstance(response, QueryResponse)
    assert (session, response.correlation_id, response.status) == (7, 1, QueryStatus.NOT_LEADER)
    assert len(old.reads) == 0


def test_a_leader_cut_off_from_the_quorum_never_answers() -> None:
    """A partitioned leader that does not hear of the new term: its round never gets a
    quorum, so it never answers; it steps down when its followers' silence times out."""
    c = Cluster(3, seed=7)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    for other in leader.config.others:
        c.net.cut |= {(me, other), (other, me)}
    recorder = Recorder()
    leader.reads.egress = recorder
    leader.reads.add(7, 1, b"q", ready=True)
    c.run_until(lambda: leader.role is not Role.LEADER, limit=400)
    assert answered(c, me) == []
    assert [r.status for _, r in recorder.sent] == [QueryStatus.NOT_LEADER]


def test_answers_of_rounds_never_begun_and_of_other_terms_do_not_count() -> None:
    c = Cluster(3, seed=8)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    reads = leader.reads
    reads.add(7, 1, b"q", ready=True)
    leader.consensus_work(c.now)
    c.net.queue.clear()  # the round is lost on the way
    one, other = leader.config.others
    reads.on_ack(one, reads.round + 5)  # a round never begun here: ignored
    # an answer in another term is not taken by the module
    leader.on_consensus_message(
        AppendPosition(leader.leadership_term_id - 1, 0, other, read_round=reads.round), c.now
    )
    c.persist(me)
    assert answered(c, me) == []
    assert reads.rounds_confirmed == 0


def test_bounds_per_session_and_per_member() -> None:
    c = Cluster(3, seed=9)
    leader = c.leader_with_a_committed_entry()
    reads = leader.reads
    limit = leader.config.max_session_queries
    for i in range(limit):
        assert reads.add(7, i, b"q", ready=True) is None
    assert reads.add(7, limit, b"q", ready=True) is QueryStatus.BUSY
    assert reads.add(8, 0, b"q", ready=True) is None  # another session still may
    assert reads.in_flight(7) == limit
    c.run_until(lambda: len(reads) == 0)
    assert reads.add(7, 0, b"q", ready=True) is None  # answered: room again


def test_a_member_bound_refuses_past_max_queries() -> None:
    from dataclasses import replace

    c = Cluster(3, seed=10)
    leader = c.leader_with_a_committed_entry()
    reads = leader.reads
    reads.config = replace(reads.config, max_queries=10)
    for session in range(10):
        assert reads.add(session, 0, b"q", ready=True) is None
    assert reads.add(99, 0, b"q", ready=True) is QueryStatus.BUSY


def test_a_cluster_of_one_answers_at_once() -> None:
    c = Cluster(1, seed=11)
    leader = c.leader_with_a_committed_entry()
    leader.reads.add(7, 1, b"q", ready=True)
    c.step()
    assert answered(c, 0) == [1]


def test_query_repr() -> None:
    assert "index=5" in repr(Query(1, 2, b"", 5))


def test_queries_hold_up_under_random_faults() -> None:
    """Seeded runs: members paused and resumed, links cut, queries every step; every
    answer was given by a leader whose round a quorum answered in its term, at a read
    index at least the commit position any member had when the query arrived."""
    for seed in range(4):
        c = Cluster(3, seed=100 + seed)
        c.leader_with_a_committed_entry()
        highest_commit_at_arrival: dict[tuple[int, int], int] = {}
        next_id = 0
        for step in range(600):
            rng = c.rng
            if rng.random() < 0.02:
                victim = rng.randrange(3)
                if victim in c.down:
                    c.down.discard(victim)
                elif not c.down:
                    c.down.add(victim)
            if rng.random() < 0.1:
                leader = c.leader()
                if leader is not None:
                    c.append(b"w%d" % step)
            for i, cm in c.members.items():
                if cm.role is Role.LEADER and i not in c.down and rng.random() < 0.5:
                    next_id += 1
                    if cm.reads.add(7, next_id, b"q", ready=cm.is_ready_leader) is None:
                        highest_commit_at_arrival[(i, next_id)] = max(
                            m.commit_position for m in c.members.values()
                        )
            c.step(rng.choice((1, 10, 50)) * MS)
        total = 0
        for i, answers in c.answered.items():
            for query, applied in answers:
                total += 1
                assert query.read_index >= highest_commit_at_arrival[(i, query.correlation_id)]
                assert applied >= query.read_index
        assert total > 100


def test_a_catch_up_member_answering_does_not_make_a_quorum() -> None:
    """A member whose state is new or lost counts toward no quorum: its answer to a
    read round confirms nothing while the other voter is cut off."""
    c = Cluster(3, seed=14)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    wiped, other = leader.config.others
    c.wipe(wiped)  # restarts on an empty disk: a catch-up member
    c.stuck.add(wiped)  # and stays one (its disk takes nothing: it never catches up)
    c.run_until(lambda: not next(p for p in leader.followers if p.member_id == wiped).voter)
    c.net.cut |= {(me, other), (other, me)}
    leader.reads.add(7, 1, b"q", ready=True)
    leader.consensus_work(c.now)
    deliver(c)
    deliver(c)
    assert leader.reads._acks.get(wiped) == leader.reads.round  # it did answer
    assert not next(p for p in leader.followers if p.member_id == wiped).voter
    assert answered(c, me) == []
    c.net.cut.clear()
    c.now += leader.config.leader_heartbeat_interval_ns  # the round is sent again
    leader.consensus_work(c.now)
    deliver(c)
    deliver(c)
    assert answered(c, me) == [1]


def test_the_query_bounds_are_settings_and_the_counters_are_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cluster.agents.exporter import StatusCollector
    from cluster.config import load_config
    from cluster.protocol.admin import MemberStatus

    config = load_config(["--max-session-queries", "3", "--max-queries", "40"], {})
    limits = config.session_limits()
    assert (limits["max_session_queries"], limits["max_queries"]) == (3, 40)
    status = MemberStatus(member_id=1, counters={"queries": 5, "read_rounds": 2})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    assert 'triarch_queries_total{member="1"} 5.0' in text
    assert 'triarch_read_rounds_total{member="1"} 2.0' in text
