"""`/health`'s verdict from a member's status (issue #21)."""

from __future__ import annotations

import pytest

from cluster.agents.exporter import health
from cluster.protocol.admin import MemberStatus


@pytest.mark.parametrize(
    ("role", "state", "leader", "heard", "ok"),
    [
        ("LEADER", "ACTIVE", 0, True, True),
        ("LEADER", "SNAPSHOT", 0, True, True),  # taking a snapshot still leads
        ("LEADER", "SUSPENDED", 0, True, True),
        ("LEADER", "ACTIVE", 0, False, False),  # no quorum heard from
        ("LEADER", "QUITTING", 0, True, False),
        ("FOLLOWER", "ACTIVE", 1, True, True),
        ("FOLLOWER", "ACTIVE", 1, False, False),  # its leader went silent
        ("FOLLOWER", "ACTIVE", -1, True, False),
        ("CANDIDATE", "ACTIVE", -1, False, False),
    ],
)
def test_health_says_whether_a_leader_with_a_quorum_is_seen(
    role: str, state: str, leader: int, heard: bool, ok: bool
) -> None:
    status = MemberStatus(member_id=0, role=role, module_state=state, leader_member_id=leader)
    verdict, reason = health(status, heard)
    assert verdict is ok
    assert reason
