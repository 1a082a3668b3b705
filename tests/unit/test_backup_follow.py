"""Whom the continuous backup reads from, and when it calls itself healthy
(:mod:`cluster.backup.follow`)."""

from __future__ import annotations

import time

from cluster.backup.follow import BackupState, source_order
from cluster.config import MemberEndpoints
from cluster.protocol.admin import MemberStatus
from cluster.tool.client import Result


def described(*statuses: MemberStatus | None) -> list[Result]:
    results = []
    for i, status in enumerate(statuses):
        result = Result(MemberEndpoints(i, "127.0.0.1", 1, 2, 3), status=status)
        if status is None:
            result.error = "connection refused"
        results.append(result)
    return results


def follower(member: int, commit: int, leader: int = 0, catching_up: bool = False) -> MemberStatus:
    return MemberStatus(member_id=member, role="FOLLOWER", leader_member_id=leader,
                        commit_position=commit, catching_up=catching_up)  # fmt: skip


def test_a_follower_of_the_leader_first_the_one_read_from_last_time_before_the_others() -> None:
    leader = MemberStatus(member_id=0, role="LEADER", commit_position=500)
    members = described(leader, follower(1, 400), follower(2, 450))
    assert source_order(members, 0) == [2, 1, 0]
    assert source_order(members, 0, current=1) == [1, 2, 0]


def test_a_catching_up_member_or_one_that_follows_no_one_comes_last() -> None:
    leader = MemberStatus(member_id=0, role="LEADER", commit_position=500)
    members = described(leader, follower(1, 10, catching_up=True), follower(2, 450, leader=-1))
    assert source_order(members, 0) == [0, 1, 2]
    assert source_order(described(None, follower(1, 5, leader=-1), None), -1) == [1]


def test_healthy_only_after_a_recent_poll_with_a_lag_within_the_bound() -> None:
    state = BackupState()
    ok, reasons = state.health(1000, 10.0)
    assert not ok
    assert reasons[0].startswith("no successful poll yet")
    state.last_ok = time.monotonic()
    state.cluster_commit, state.held = 5000, 4500
    assert state.lag_bytes == 500
    assert state.health(1000, 10.0)[0]
    state.held = 3000
    ok, reasons = state.health(1000, 10.0)
    assert not ok
    assert reasons == ["lag 2000 bytes over the bound 1000"]
    state.held, state.last_ok = 5000, time.monotonic() - 60
    state.last_error = "member 1: no reply within 10s"
    ok, reasons = state.health(1000, 10.0)
    assert not ok
    assert "last successful poll" in reasons[0]
    assert "no reply" in reasons[0]
