"""Leadership hand-over (``cluster.core.handover``): a leader hands leadership to its
most up-to-date voting follower with TimeoutNow, on request, when it stops, and when its
own log cannot be made durable; nothing committed is lost (the harness checks every step).
"""

from __future__ import annotations

import logging

import pytest
from core_harness import MS, Cluster

from cluster.protocol.consensus import VOTE_TRANSFER, RequestVote, TimeoutNow
from cluster.protocol.enums import Role
from cluster.protocol.ingress import SessionMessageHeader


def steps_until(c: Cluster, predicate, limit: int = 2000) -> int:  # type: ignore[no-untyped-def]
    for n in range(limit):
        if predicate():
            return n
        c.step()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("n", [3, 5])
def test_a_hand_over_elects_the_target_within_a_few_round_trips(n: int) -> None:
    c = Cluster(n, seed=11)
    leader = c.leader_with_a_committed_entry()
    for k in range(10):
        c.append(f"w{k}".encode())
    assert leader.handover.start(c.now, None, "test") == ""
    target = leader.handover.target
    assert target != leader.config.member_id
    # 10 ms a step: well within one election timeout (300 ms), no heartbeat timeout
    took = steps_until(c, lambda: c.leader() is not None and c.leader() is not leader)
    assert took * 10 * MS < 300 * MS
    new = c.leader()
    assert new is not None
    assert new.config.member_id == target
    assert leader.role is Role.FOLLOWER
    end = new.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))


def test_a_requested_hand_over_is_info_and_a_failing_disks_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """WARNING is for what an operator must act on: a hand-over asked for (a stop,
    ``transfer-leadership``) is routine; one forced by a log that does not become
    durable is not."""
    caplog.set_level(logging.DEBUG, "cluster")
    c = Cluster(3, seed=12)
    leader = c.leader_with_a_committed_entry()
    assert leader.handover.start(c.now, None, "this member is stopping") == ""
    steps_until(c, lambda: c.leader() is not None and c.leader() is not leader)
    (asked,) = [r for r in caplog.records if "hands leadership of" in r.getMessage()]
    assert asked.levelno == logging.INFO
    assert "this member is stopping" in asked.getMessage()

    caplog.clear()
    new = c.leader()
    assert new is not None
    c.stuck.add(new.config.member_id)
    c.append(b"never durable here")
    steps_until(c, lambda: c.leader() is not None and c.leader() is not new)
    forced = [r for r in caplog.records if "hands leadership of" in r.getMessage()]
    assert forced
    assert all(r.levelno == logging.WARNING for r in forced)


def test_a_hand_over_to_a_named_member() -> None:
    c = Cluster(5, seed=12)
    leader = c.leader_with_a_committed_entry()
    to = max(i for i in range(5) if i != leader.config.member_id)
    assert leader.handover.start(c.now, to, "test") == ""
    steps_until(c, lambda: c.leader() is not None and c.leader() is not leader)
    new = c.leader()
    assert new is not None
    assert new.config.member_id == to


def test_a_hand_over_is_refused_to_whom_it_cannot_go() -> None:
    c = Cluster(3, seed=13)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    assert "not another member" in leader.handover.start(c.now, 7, "test")
    assert "not another member" in leader.handover.start(c.now, me, "test")
    wiped = next(i for i in range(3) if i != me)
    c.wipe(wiped)
    c.down.add(wiped)
    c.step()
    follower = c.members[next(i for i in range(3) if i not in (me, wiped))]
    assert follower.handover.start(c.now, None, "test") == "this member is not the ready leader"
    leader.followers.get(wiped).voter = False  # type: ignore[union-attr]
    assert "not a voting follower" in leader.handover.start(c.now, wiped, "test")


def test_a_leader_handing_over_takes_no_new_work() -> None:
    c = Cluster(3, seed=14)
    leader = c.leader_with_a_committed_entry()
    for i in range(3):  # keep the hand-over from happening: nobody hears the leader
        if i != leader.config.member_id:
            c.net.cut |= {(leader.config.member_id, i)}
    assert leader.handover.start(c.now, None, "test") == ""
    assert leader.handover.active
    header = SessionMessageHeader(leader.leadership_term_id, 1, 0, b"x")
    assert not leader.on_ingress_message(header, c.now)
    assert leader.consensus_work(c.now) == 0
    # not done within the election timeout: given up, the leader takes work again
    for _ in range(40):
        c.step()
    assert not leader.handover.active
    assert leader.role is Role.LEADER


def test_timeout_now_is_obeyed_only_from_the_members_own_leader_of_its_term() -> None:
    c = Cluster(3, seed=15)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    follower = c.members[next(i for i in range(3) if i != me)]
    other = next(i for i in range(3) if i not in (me, follower.config.member_id))
    follower.on_consensus_message(TimeoutNow(term - 1, me, follower.config.member_id), c.now)
    follower.on_consensus_message(TimeoutNow(term, other, follower.config.member_id), c.now)
    assert follower.election is None
    assert follower.role is Role.FOLLOWER
    follower.on_consensus_message(TimeoutNow(term, me, follower.config.member_id), c.now)
    assert follower.election is not None
    assert follower.candidate_term_id == term + 1  # it nominated at once


def test_only_a_transfer_ballot_is_heard_by_members_with_a_live_leader() -> None:
    c = Cluster(3, seed=16)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    a = next(i for i in range(3) if i != me)
    b = next(i for i in range(3) if i not in (me, a))
    pos = leader.log.published_position
    log_term = leader.log.terms.term_at(pos)
    plain = RequestVote(log_term, pos, term + 1, a, 0)
    c.members[b].on_consensus_message(plain, c.now)
    leader.on_consensus_message(plain, c.now)
    assert c.members[b].candidate_term_id == term
    assert leader.role is Role.LEADER
    transfer = RequestVote(log_term, pos, term + 1, a, 0, VOTE_TRANSFER)
    c.members[b].on_consensus_message(transfer, c.now)
    leader.on_consensus_message(transfer, c.now)
    assert c.members[b].candidate_term_id == term + 1
    assert leader.role is Role.FOLLOWER


def test_a_leader_whose_log_cannot_be_made_durable_steps_aside() -> None:
    """Its archive stops taking writes: after a heartbeat timeout (1 s here) it hands
    over or steps down, another member leads, and it never leads while its disk fails."""
    c = Cluster(3, seed=17)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    committed = leader.commit_position
    c.stuck.add(me)
    c.append(b"never durable here")
    took = steps_until(c, lambda: c.leader() is not None and c.leader() is not leader)
    assert took * 10 * MS < 2500 * MS  # the heartbeat timeout and an election or two
    assert leader.role is not Role.LEADER
    for _ in range(300):
        c.step()
        assert leader.role is not Role.LEADER or leader.log.archive_position >= committed
    c.stuck.discard(me)
    new = c.leader()
    assert new is not None
    new._append(SessionMessageHeader(new.leadership_term_id, 1, 0, b"after"))
    end = new.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))


def _slow_disk_run(c: Cluster, slow: int, seconds: float, took_ms: int = 400) -> None:
    """Member ``slow``'s appends take ``took_ms`` each to become durable, under a
    message a step (10 ms) on the leader, for ``seconds`` or until the leader changes."""
    first = c.leader()
    c.slow[slow] = took_ms * MS
    for step in range(int(seconds * 100)):
        if c.leader() is not first:
            break
        if first is not None and not first.handover.active:  # it takes no work then
            c.append(f"m{step}".encode())
        c.step()
    del c.slow[slow]


def _tighten(c: Cluster, threshold_ms: int = 200, period_ms: int = 2000) -> None:
    for cm in c.members.values():
        cm.handover.disk_latency.threshold_ns = threshold_ms * MS
        cm.handover.disk_latency.period_ns = period_ms * MS


def test_a_leader_whose_disk_is_slow_hands_leadership_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every append takes 400 ms to become durable on the leader (its log does become
    durable: never a heartbeat timeout's stall): past a 200 ms bound for 2 s it hands
    leadership over, with a WARNING naming the slow disk, and nothing committed is
    lost (the harness checks every step)."""
    caplog.set_level(logging.DEBUG, "cluster")
    c = Cluster(3, seed=21)
    _tighten(c)
    leader = c.leader_with_a_committed_entry()
    began = c.now
    _slow_disk_run(c, leader.config.member_id, 6.0)
    steps_until(c, lambda: c.leader() is not None)
    new = c.leader()
    assert new is not None
    assert new is not leader
    assert c.now - began < 3500 * MS  # the 2 s period, a slow append or two, a round trip
    (told,) = [r for r in caplog.records if "its disk is slow" in r.getMessage()]
    assert told.levelno == logging.WARNING
    assert "hands leadership of" in told.getMessage()
    end = new.log.published_position
    c.run_until(lambda: all(cm.commit_position >= end for cm in c.members.values()))


def test_a_slow_follower_or_a_slow_disk_under_the_bound_moves_no_leadership() -> None:
    """The rule is the leader's own disk, over its bound: a follower's slow disk (the
    others commit without it), or a leader's 400 ms appends under the default 1 s
    bound, leave the leader where it is."""
    c = Cluster(3, seed=22)
    _tighten(c)
    leader = c.leader_with_a_committed_entry()
    follower = next(i for i in range(3) if i != leader.config.member_id)
    _slow_disk_run(c, follower, 5.0)
    assert c.leader() is leader
    c = Cluster(3, seed=23)  # the defaults: 1 s, for 10 s
    leader = c.leader_with_a_committed_entry()
    _slow_disk_run(c, leader.config.member_id, 12.0)
    assert c.leader() is leader
    assert leader.handover.disk_latency.slow_since_ns is None


def test_an_idle_leader_or_an_off_rule_never_hands_over_for_its_disk() -> None:
    c = Cluster(3, seed=24)
    _tighten(c, threshold_ms=0)  # off
    leader = c.leader_with_a_committed_entry()
    _slow_disk_run(c, leader.config.member_id, 5.0)
    assert c.leader() is leader
    c = Cluster(3, seed=25)
    _tighten(c)
    leader = c.leader_with_a_committed_entry()
    c.slow[leader.config.member_id] = 400 * MS  # slow, but nothing to write
    for _ in range(500):
        c.step()
    assert c.leader() is leader
