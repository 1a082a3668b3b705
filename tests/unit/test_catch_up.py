"""Catch-up members (``cluster.core.voting``): a member whose disk is new or lost votes
for nobody and counts toward no quorum until a leader elected by others has caught it
up; a brand-new cluster still starts by itself once every member answers.

The core alone, in the seeded harness of ``core_harness.py``, which checks after every
step that no entry ever committed is lost or changed (``Cluster.ever_committed``).
"""

from __future__ import annotations

import logging
import random

import pytest
from core_harness import SECOND, Cluster, NullEgress
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.base import ConsensusConfig
from cluster.core.consensus import ConsensusModule
from cluster.core.terms import TermHistory
from cluster.protocol.consensus import (
    APPEND_POSITION_CATCHING_UP,
    APPEND_POSITION_VERIFIED,
    AppendPosition,
)
from cluster.protocol.enums import Role
from cluster.protocol.ingress import SessionMessageHeader


def voting(c: Cluster) -> set[int]:
    return {i for i, cm in c.members.items() if not cm.voting.catching_up}


def commit_entries(c: Cluster, count: int, prefix: str = "w") -> int:
    """Append ``count`` entries at the leader; run until the leader has committed them."""
    leader = c.leader()
    assert leader is not None
    for k in range(count):
        c.append(f"{prefix}{k}".encode())
    end = leader.log.published_position
    c.run_until(lambda: leader.commit_position >= end)
    return end


def test_a_brand_new_cluster_starts_once_every_member_has_answered() -> None:
    c = Cluster(3, seed=1, catching_up=True)
    assert voting(c) == set()
    c.run_until(lambda: c.leader() is not None)
    assert voting(c) == {0, 1, 2}


@pytest.mark.parametrize("n", [3, 5])
def test_new_members_without_all_the_others_never_start(
    n: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Two empty members of three are no signal: the third may hold what a quorum with
    their lost disks acknowledged.  Each says why it waits, every 10 s."""
    c = Cluster(n, seed=2, catching_up=True)
    c.down.add(n - 1)
    with caplog.at_level(logging.WARNING, logger="cluster.consensus"):
        for _ in range(2100):  # 21 s: many startup canvass timeouts
            c.step()
            assert c.leader() is None
            assert not any(cm.role is Role.LEADER for cm in c.members.values())
    assert voting(c) == set()
    waiting = [r.getMessage() for r in caplog.records if "is a catch-up member" in r.getMessage()]
    assert len(waiting) == 2 * (n - 1)  # at 10 s and 20 s, by each member that is up
    assert all(f"no answer from member(s) {n - 1}" in text for text in waiting)


def test_a_replaced_disk_never_votes_a_stale_member_in() -> None:
    """The issue's scenario: follower A is stopped; entries are acknowledged by the
    leader and follower B; the leader and B are stopped; B's disk is replaced; A and B
    start.  Before: B voted for A, whose log lacks the entries, and they were lost.
    Now: no leader until the old leader is back, and nothing is lost."""
    c = Cluster(3, seed=3)
    leader = c.leader_with_a_committed_entry()
    old = leader.config.member_id
    a, b = (i for i in range(3) if i != old)
    c.down.add(a)
    end = commit_entries(c, 50)
    acknowledged = bytes(c.disk[old][:end])
    c.down |= {old, b}
    c.wipe(b)
    c.down -= {a, b}
    for _ in range(500):  # 5 s: a startup canvass timeout and many election timeouts
        c.step()
        up = [cm for i, cm in c.members.items() if i not in c.down]
        assert not any(cm.role is Role.LEADER for cm in up), "a stale leader"
    assert c.members[b].voting.catching_up
    c.down.discard(old)
    c.run_until(lambda: c.leader() is not None)
    c.run_until(lambda: voting(c) == {0, 1, 2})
    final = c.leader()
    assert final is not None
    c.run_until(lambda: all(len(c.disk[i]) >= end for i in range(3)))
    for i in range(3):
        assert bytes(c.disk[i][:end]) == acknowledged


def test_a_catch_up_member_counts_toward_no_quorum() -> None:
    """A catch-up member's acknowledgements move no commit position, and a leader that
    hears only from catch-up members has no quorum: it steps down."""
    c = Cluster(3, seed=4)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    a, b = (i for i in range(3) if i != me)
    c.down |= {a, b}
    c.append(b"x")
    c.step()
    end = leader.log.published_position
    before = leader.commit_position
    assert before < end == leader.log.archive_position
    flags = APPEND_POSITION_VERIFIED | APPEND_POSITION_CATCHING_UP
    leader.on_consensus_message(AppendPosition(term, end, a, flags), c.now)
    assert leader.commit_position == before
    for _ in range(150):  # past the heartbeat timeout, hearing from `a` only
        c.step()
        leader.on_consensus_message(AppendPosition(term, end, a, flags), c.now)
    assert leader.role is not Role.LEADER
    assert leader.commit_position == before


def test_a_voting_members_acknowledgement_commits() -> None:
    """The same report without the flag commits (the control for the test above)."""
    c = Cluster(3, seed=4)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    a, b = (i for i in range(3) if i != me)
    c.down |= {a, b}
    c.append(b"x")
    c.step()
    end = leader.log.published_position
    leader.on_consensus_message(AppendPosition(term, end, a, APPEND_POSITION_VERIFIED), c.now)
    assert leader.commit_position == end


def test_a_wiped_member_votes_again_once_the_leader_has_caught_it_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "cluster")
    c = Cluster(3, seed=5)
    leader = c.leader_with_a_committed_entry()
    wiped = next(i for i in range(3) if i != leader.config.member_id)
    end = commit_entries(c, 20)
    c.wipe(wiped)
    member = c.members[wiped]
    assert member.voting.catching_up
    c.run_until(lambda: not member.voting.catching_up)
    assert member.commit_position >= end
    assert bytes(c.disk[wiped][:end]) == bytes(c.disk[leader.config.member_id][:end])
    # routine (every new member does it): INFO, not a WARNING for `cluster-tool errors`
    (again,) = [r for r in caplog.records if "is a voting member again" in r.getMessage()]
    assert again.levelno == logging.INFO
    # and the leader counts it again: with the third member down, it still commits
    third = next(i for i in range(3) if i not in (wiped, leader.config.member_id))
    c.down.add(third)
    commit_entries(c, 3, prefix="after")


def test_a_catch_up_member_refuses_votes_and_never_nominates() -> None:
    c = Cluster(3, seed=6)
    c.leader_with_a_committed_entry()
    c.wipe(2)
    member: ConsensusModule = c.members[2]
    c.down |= {0, 1}
    for _ in range(400):
        c.step()
    assert member.election is not None
    assert member.election.votes == {}
    assert member.candidate_term_id == -1  # never proposed or adopted a term


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.sampled_from([3, 5]))
def test_random_faults_with_replaced_disks_never_lose_a_committed_entry(seed: int, n: int) -> None:
    """Crashes, partitions and wiped members (one at a time, while every other member
    is up and votes: a majority of lost disks is lost data): the harness checks every
    step that nothing committed is lost; at the end everyone converges."""
    c = Cluster(n, seed=seed, catching_up=seed % 2 == 0)
    rng = random.Random(seed)
    wipes = 0
    for step in range(400):
        roll = rng.random()
        if roll < 0.03:
            victim = rng.randrange(n)
            if victim in c.down:
                c.down.discard(victim)
            elif len(c.down) < (n - 1) // 2:
                c.down.add(victim)
        elif roll < 0.05:
            a, b = rng.sample(range(n), 2)
            c.net.cut ^= {(a, b), (b, a)}
        elif roll < 0.07 and not c.down and voting(c) == set(range(n)):
            wipes += 1
            c.wipe(rng.randrange(n), generation=wipes)
        elif roll < 0.3 and c.leader() is not None:
            c.append(f"w{step}".encode())
        c.step()
    c.down.clear()
    c.net.cut.clear()
    for _ in range(300):
        c.step()
    c.run_until(lambda: c.leader() is not None, limit=4000)
    leader = c.leader()
    assert leader is not None
    leader._append(SessionMessageHeader(leader.leadership_term_id, 1, 0, b"final"))
    end = leader.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))
    assert len({bytes(c.disk[i][:end]) for i in c.members}) == 1
    assert bytes(c.disk[leader.config.member_id][:end]).startswith(c.ever_committed)
    c.run_until(lambda: voting(c) == set(range(n)))


def test_a_cluster_of_one_whose_state_was_lost_still_leads() -> None:
    """Nobody else can catch a lone member up: its own log is all there is."""
    cm = ConsensusModule(
        ConsensusConfig(member_id=0, member_ids=(0,)),
        NullEgress(),
        log_position=4096,
        terms=TermHistory([(0, 0)]),
        catching_up=True,
    )
    cm.enter_election(SECOND, "start-up", is_startup=True)
    cm.consensus_work(SECOND)
    assert not cm.voting.catching_up
    assert cm.role is Role.LEADER
