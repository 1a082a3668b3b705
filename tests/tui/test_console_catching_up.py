"""The console shows a catch-up member (issue 31): its role reads "FOLLOWER (catching up)"
and the events say when it starts and stops catching up."""

from __future__ import annotations

from rich.text import Text

from cluster.config import parse_members
from cluster.protocol.admin import MemberStatus
from tui.model import ClusterModel
from tui.render import member_values
from tui.source import MemberPoll

MEMBERS = parse_members("0=h:1:2:3,1=h:4:5:6,2=h:7:8:9")


def body(member_id: int, role: str = "FOLLOWER", *, catching_up: bool = False) -> MemberStatus:
    return MemberStatus(
        member_id=member_id,
        role=role,
        leadership_term_id=0,
        leader_member_id=0,
        election_state="CLOSED",
        catching_up=catching_up,
        pid=100 + member_id,
    )


def poll_all(model: ClusterModel, at: float, bodies: dict[int, MemberStatus | str]) -> list[str]:
    polls = [
        MemberPoll(
            mid, at, b if isinstance(b, MemberStatus) else None, b if isinstance(b, str) else ""
        )
        for mid, b in sorted(bodies.items())
    ]
    return [e.text for e in model.apply_round(polls)]


def role_cell(model: ClusterModel, member_id: int) -> str:
    cell = dict(member_values(model.members[member_id], 0.0))["role"]
    return cell.plain if isinstance(cell, Text) else str(cell)


def test_a_catching_up_member_is_shown_and_its_catch_up_told() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    poll_all(model, 0.0, {0: body(0, "LEADER"), 1: body(1), 2: body(2, catching_up=True)})
    assert role_cell(model, 2) == "FOLLOWER (catching up)"
    assert role_cell(model, 1) == "FOLLOWER"
    assert model.members[2].catching_up is True

    events = poll_all(model, 1.0, {0: body(0, "LEADER"), 1: body(1), 2: body(2)})
    assert "member 2 caught up: a voting member again" in events
    assert role_cell(model, 2) == "FOLLOWER"

    events = poll_all(model, 2.0, {0: body(0, "LEADER"), 1: body(1, catching_up=True), 2: body(2)})
    assert any(e.startswith("member 1 catching up") for e in events)
    # down: no longer shown as catching up
    poll_all(model, 3.0, {0: body(0, "LEADER"), 1: "connection refused", 2: body(2)})
    poll_all(model, 3.5, {0: body(0, "LEADER"), 1: "connection refused", 2: body(2)})
    assert model.members[1].catching_up is False
