"""Election and replication in the sans-IO core: several ConsensusModules wired together.

A tiny discrete-event harness (no Trio; its pieces are in ``core_harness.py``): messages
between members are queued and delivered in a seeded order, each member's "archive" is a
bytearray that takes the module's log batches at once, and time only moves when the test
says so.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from core_harness import MS, Cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.archive.record import iter_records
from cluster.core.base import ConsensusConfig
from cluster.core.election import ElectionState
from cluster.protocol.codec import LOG
from cluster.protocol.consensus import (
    APPEND_POSITION_VERIFIED,
    AppendPosition,
    AppendRequest,
    CommitPosition,
    RequestVote,
)
from cluster.protocol.enums import Role
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.log import NewLeadershipTermEvent


def payloads(disk: bytes) -> list[bytes]:
    out = []
    for _, body in iter_records(disk):
        message = LOG.decode(body)
        if isinstance(message, SessionMessageHeader):
            out.append(message.payload)
    return out


def test_three_members_elect_one_leader_and_replicate() -> None:
    c = Cluster(3)
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    followers = [cm for cm in c.members.values() if cm is not leader]
    assert all(cm.role is Role.FOLLOWER for cm in followers)
    assert all(cm.leader_member_id == leader.config.member_id for cm in followers)
    for i in range(20):
        c.append(f"m{i}".encode())
    end = leader.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))
    assert len({bytes(d) for d in c.disk.values()}) == 1
    assert payloads(c.disk[0]) == [f"m{i}".encode() for i in range(20)]


def test_single_member_elects_itself() -> None:
    c = Cluster(1)
    c.run_until(lambda: c.leader() is not None, limit=10)


def test_leader_failure_elects_a_new_leader_that_keeps_committed_entries() -> None:
    c = Cluster(3, seed=2)
    c.run_until(lambda: c.leader() is not None)
    old = c.leader()
    assert old is not None
    for i in range(10):
        c.append(f"a{i}".encode())
    end = old.log.published_position
    c.run_until(lambda: old.commit_position >= end)
    c.down.add(old.config.member_id)
    c.run_until(lambda: c.leader() is not None and c.leader() is not old)
    new = c.leader()
    assert new is not None
    assert new.leadership_term_id > old.leadership_term_id
    assert payloads(c.disk[new.config.member_id])[:10] == [f"a{i}".encode() for i in range(10)]


def test_deposed_leaders_uncommitted_entries_are_truncated() -> None:
    c = Cluster(3, seed=3)
    c.run_until(lambda: c.leader() is not None)
    old = c.leader()
    assert old is not None
    me = old.config.member_id
    others = [i for i in c.members if i != me]
    c.append(b"committed")
    end = old.log.published_position
    c.run_until(lambda: old.commit_position >= end)
    # cut the leader off, then let it append entries no one else gets
    for o in others:
        c.net.cut |= {(me, o), (o, me)}
    for i in range(5):
        c.append(f"lost{i}".encode())
    c.run_until(lambda: any(c.members[o].is_ready_leader for o in others))
    new = next(c.members[o] for o in others if c.members[o].is_ready_leader)
    new.on_ingress_message  # noqa: B018  (new leader is ready)
    new._append(SessionMessageHeader(new.leadership_term_id, 1, 0, b"new"))
    c.net.cut.clear()
    c.run_until(
        lambda: (
            old.role is Role.FOLLOWER
            and old.commit_position >= new.commit_position >= new.log.published_position
        )
    )
    assert old.counters.truncations >= 1
    assert payloads(c.disk[me]) == [b"committed", b"new"]
    assert c.disk[me] == c.disk[new.config.member_id]


def test_vote_refused_to_a_candidate_with_an_older_log() -> None:
    c = Cluster(3, seed=4)
    leader = c.leader_with_a_committed_entry()
    follower = next(cm for cm in c.members.values() if cm.role is Role.FOLLOWER)
    follower.enter_election(c.now, "test")
    c.net.queue.clear()
    follower.on_consensus_message(
        RequestVote(
            log_leadership_term_id=-1,
            log_position=0,
            candidate_term_id=follower.candidate_term_id + 5,
            candidate_member_id=leader.config.member_id,
            protocol_version=0,
        ),
        c.now,
    )
    (vote,) = [m for _, _, m in c.net.queue]
    assert vote.vote is False
    assert follower.election is not None
    assert follower.election.state is not ElectionState.FOLLOWER_BALLOT


def test_follower_rejects_append_from_stale_term() -> None:
    c = Cluster(3, seed=5)
    c.run_until(lambda: c.leader() is not None)
    follower = next(cm for cm in c.members.values() if cm.role is Role.FOLLOWER)
    c.net.queue.clear()
    follower.on_consensus_message(
        AppendRequest(
            leadership_term_id=follower.leadership_term_id - 1,
            leader_member_id=(follower.config.member_id + 1) % 3,
            log_position=0,
            prev_term_id=-1,
            data_term_id=0,
            term_base_log_position=0,
            commit_position=10**9,
            data=b"",
        ),
        c.now,
    )
    (reply,) = [m for _, _, m in c.net.queue]
    assert reply.leadership_term_id == follower.candidate_term_id
    assert follower.commit_position < 10**9


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.sampled_from([3, 5]))
def test_random_crashes_and_partitions_keep_committed_logs_consistent(seed: int, n: int) -> None:
    c = Cluster(n, seed=seed)
    rng = random.Random(seed)
    written = 0
    for _ in range(300):
        roll = rng.random()
        if roll < 0.03:
            victim = rng.randrange(n)
            if victim in c.down:
                c.down.discard(victim)
            elif len(c.down) < (n - 1) // 2:
                c.down.add(victim)
        elif roll < 0.06:
            a, b = rng.sample(range(n), 2)
            c.net.cut ^= {(a, b), (b, a)}
        elif roll < 0.3 and c.leader() is not None:
            c.append(f"w{written}".encode())
            written += 1
        c.step()
    c.down.clear()
    c.net.cut.clear()
    for _ in range(300):  # heal: a leader cut off until now finds out it was deposed
        c.step()
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    leader._append(SessionMessageHeader(leader.leadership_term_id, 1, 0, b"final"))
    end = leader.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))
    logs = {bytes(c.disk[i][:end]) for i in c.members}
    assert len(logs) == 1
    # every term's leader starts its term with a NewLeadershipTermEvent
    kinds = [LOG.decode(b) for _, b in iter_records(next(iter(logs)))]
    assert isinstance(kinds[0], NewLeadershipTermEvent)


@pytest.mark.parametrize("n", [3, 5])
def test_minority_partition_cannot_elect(n: int) -> None:
    c = Cluster(n, seed=7)
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    lonely = next(i for i, cm in c.members.items() if cm is not leader)
    for o in c.members:
        if o != lonely:
            c.net.cut |= {(lonely, o), (o, lonely)}
    for _ in range(300):
        c.step()
    assert c.members[lonely].role is not Role.LEADER
    assert leader.is_ready_leader
    # no term inflation from the cut-off member: it never got a quorum to canvass
    assert c.members[lonely].candidate_term_id == leader.leadership_term_id


def test_whole_records_end_cuts_at_a_record_boundary() -> None:
    from cluster.agents.replication import whole_records_end
    from cluster.archive.record import encode_record

    records = [encode_record(b"x" * n) for n in (5, 300, 7)]
    data = b"".join(records)
    ends = [100 + sum(len(r) for r in records[: i + 1]) for i in range(3)]
    assert whole_records_end(100, data) == ends[2]
    assert whole_records_end(100, data[: len(records[0]) + 20]) == ends[0]
    # not even the first record is whole: where it would end
    assert whole_records_end(100, data[:10]) == ends[0]
    assert whole_records_end(100, data[:3]) == 100


def test_commit_position_rides_on_appends_and_the_slow_tick_sends_the_rest() -> None:
    """A commit advance sends nothing by itself: the next AppendRequest to a follower
    carries it, and the slow tick sends a CommitPosition only to followers that no
    AppendRequest has told, once."""
    c = Cluster(3, seed=5)
    leader = c.leader_with_a_committed_entry()
    first, second = sorted(p.member_id for p in leader.followers)
    term = leader.leadership_term_id

    def commits_sent() -> dict[int, int]:
        sent = {
            receiver: message.log_position
            for sender, receiver, message in c.net.queue
            if sender == leader.config.member_id and isinstance(message, CommitPosition)
        }
        c.net.queue.clear()
        return sent

    c.append(b"y")
    middle = leader.log.published_position
    c.append(b"z")
    last = leader.log.published_position
    c.persist(leader.config.member_id)
    commits_sent()
    # a quorum holds "y": no CommitPosition goes out
    leader.on_consensus_message(
        AppendPosition(term, middle, first, APPEND_POSITION_VERIFIED), c.now
    )
    assert leader.commit_position == middle
    assert commits_sent() == {}
    # an AppendRequest to the first follower carries it ...
    assert leader.replication.append_request(first, middle, b"").commit_position == middle
    # ... so the slow tick tells only the second one, and only once
    leader.on_slow_tick(c.now + 1)
    assert commits_sent() == {second: middle}
    leader.on_slow_tick(c.now + 2)
    assert commits_sent() == {}
    # the whole log committed: nothing at once, both at the next slow tick
    leader.on_consensus_message(AppendPosition(term, last, first, APPEND_POSITION_VERIFIED), c.now)
    assert leader.commit_position == last
    assert commits_sent() == {}
    leader.on_slow_tick(c.now + 3)
    assert commits_sent() == {first: last, second: last}


# ---------------------------------------------------------------------- restarts

STARTUP_CANVASS_NS = ConsensusConfig(0, (0,)).startup_canvass_timeout_ns
"""The default a member starts with: how long it waits for every member at start-up."""


def steps_until(c: Cluster, predicate: Callable[[], bool], limit: int = 6000) -> int:
    for taken in range(limit):
        if predicate():
            return taken
        c.step()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize(("n", "seed"), [(3, 21), (3, 22), (5, 23)])
def test_a_cluster_restarted_with_a_member_missing_elects_without_it(n: int, seed: int) -> None:
    """Every member stops; all but one (a majority, disks intact) start again with the
    default start-up canvass timeout: a leader within that and an election timeout (the
    nomination's random delay, half of it, and a ballot), not once the missing member
    comes back.  Nothing committed is lost (the harness checks it every step), writes
    commit, and the missing member catches up when it returns."""
    c = Cluster(n, seed=seed)
    leader = c.leader_with_a_committed_entry()
    for k in range(20):
        c.append(f"before{k}".encode())
    end = leader.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))
    c.down |= set(range(n))
    for _ in range(50):
        c.step()
    missing = (leader.config.member_id + 1) % n
    for i in range(n):
        if i != missing:
            c.restart(i, startup_canvass_timeout_ns=STARTUP_CANVASS_NS)
    election_timeout = leader.config.election_timeout_ns
    took = steps_until(c, lambda: c.leader() is not None) * 10 * MS
    assert took <= STARTUP_CANVASS_NS + election_timeout, f"a leader after {took / MS} ms"
    new = c.leader()
    assert new is not None
    assert new.config.member_id != missing
    for k in range(10):
        c.append(f"after{k}".encode())
    end = new.log.published_position
    c.run_until(lambda: new.commit_position >= end)
    c.restart(missing, startup_canvass_timeout_ns=STARTUP_CANVASS_NS)
    c.run_until(lambda: c.members[missing].commit_position >= end)
    assert bytes(c.disk[missing][:end]) == bytes(c.disk[new.config.member_id][:end])
    assert payloads(c.disk[missing])[-10:] == [f"after{k}".encode() for k in range(10)]
    assert c.members[missing].leader_member_id == new.config.member_id


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.sampled_from([3, 5]))
def test_any_majority_restarted_on_intact_disks_keeps_every_committed_entry(
    seed: int, n: int
) -> None:
    """Faults with writes in flight (uncommitted tails of several terms), then every
    member stops and a random majority starts again: it elects a leader by itself, and
    no entry ever committed is lost or changed (checked every step), whichever members
    the missing ones are."""
    c = Cluster(n, seed=seed)
    rng = random.Random(seed)
    for k in range(200):
        roll = rng.random()
        if roll < 0.04:
            a, b = rng.sample(range(n), 2)
            c.net.cut ^= {(a, b), (b, a)}
        elif roll < 0.4 and c.leader() is not None:
            c.append(f"w{k}".encode())
        c.step()
    c.down |= set(range(n))
    c.net.cut.clear()
    for i in rng.sample(range(n), n // 2 + 1):
        c.restart(i, startup_canvass_timeout_ns=STARTUP_CANVASS_NS)
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    committed = len(c.ever_committed)
    leader._append(SessionMessageHeader(leader.leadership_term_id, 1, 0, b"final"))
    end = leader.log.published_position
    c.run_until(lambda: leader.commit_position >= end)
    assert bytes(c.disk[leader.config.member_id][:committed]) == c.ever_committed[:committed]
