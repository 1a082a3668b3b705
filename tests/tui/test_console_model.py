"""The console's model: what it derives across ``describe`` polls (no Textual, no I/O)."""

from __future__ import annotations

from typing import Any

import msgspec

from cluster.config import parse_members
from cluster.protocol.admin import MemberStatus
from tui.model import ClusterModel
from tui.source import MemberPoll

MEMBERS = parse_members("0=h:1:2:3,1=h:4:5:6,2=h:7:8:9")


def body(member_id: int, role: str = "FOLLOWER", **overrides: Any) -> MemberStatus:
    counters = {
        "redirected_sessions": 0,
        "timed_out_sessions": 0,
        "elections": 1,
        "rejected_sessions": 0,
        "egress_failures": 0,
        "truncations": 0,
    }
    counters.update(overrides.pop("counters", {}))
    value: dict[str, Any] = {
        "member_id": member_id,
        "role": role,
        "leadership_term_id": 0,
        "candidate_term_id": 0,
        "leader_member_id": 0,
        "commit_position": 100,
        "append_position": 100,
        "election_state": "CLOSED",
        "module_state": "ACTIVE",
        "sessions": [],
        "counters": counters,
        "ingress": {"frames": 0, "protocol_errors": 0, "last_error": ""},
        "followers": [],
        "snapshots_taken": 0,
        "pid": 100 + member_id,
    }
    value.update(overrides)
    return msgspec.convert(value, MemberStatus)


def session(sid: int, idle_ms: int = 10) -> dict[str, Any]:
    return {
        "cluster_session_id": sid,
        "state": "OPEN",
        "response_channel": f"127.0.0.1:{5000 + sid}",
        "last_activity_ms_ago": idle_ms,
        "close_reason": None,
    }


def texts(events: list[Any]) -> list[str]:
    return [e.text for e in events]


def poll_all(model: ClusterModel, at: float, bodies: dict[int, MemberStatus | str]) -> list[str]:
    out: list[str] = []
    for mid in sorted(bodies):
        b = bodies[mid]
        poll = MemberPoll(
            mid, at, b if isinstance(b, MemberStatus) else None, b if isinstance(b, str) else ""
        )
        out += texts(model.apply(poll))
    return out


def test_leader_change_and_down_member() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    first = poll_all(model, 0.0, {0: body(0, "LEADER"), 1: body(1), 2: body(2)})
    assert "leader is member 0, term 0" in first
    assert model.leader_id == 0
    events = poll_all(model, 0.5, {0: "connection refused", 1: body(1), 2: body(2)})
    assert "member 0 down: connection refused" in events
    assert model.leader_id is None
    events = poll_all(
        model,
        1.0,
        {0: "connection refused", 1: body(1, "LEADER", leadership_term_id=1), 2: body(2)},
    )
    assert "new leader: member 1, term 1 (was member 0, term 0)" in events
    assert not model.members[0].up
    assert model.members[0].commit == 100


def test_timed_out_and_closed_sessions_stay_listed() -> None:
    model = ClusterModel(MEMBERS, closed_retention=10.0, wall_clock=lambda: 0.0)
    leader = body(0, "LEADER", sessions=[session(1), session(2, idle_ms=1900), session(3)])
    poll_all(model, 0.0, {0: leader})
    assert sorted(model.sessions) == [1, 2, 3]
    # session 2 timed out (the counter moved) and session 3 was closed by its client
    leader = body(0, "LEADER", sessions=[session(1)], counters={"timed_out_sessions": 1})
    events = poll_all(model, 0.5, {0: leader})
    assert "session 2 timed out after 1.9s idle" in events
    assert "session 3 closed (gone)" in events
    assert model.sessions[2].close_reason == "TIMEOUT"
    assert model.sessions[2].closed
    assert model.sessions[3].close_reason == "gone"
    assert model.expire(5.0) == []
    assert sorted(model.expire(11.0)) == [2, 3]
    assert sorted(model.sessions) == [1]


def test_sessions_are_not_closed_without_a_leader() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    poll_all(model, 0.0, {0: body(0, "LEADER", sessions=[session(1)]), 1: body(1)})
    poll_all(model, 0.5, {0: "connection refused", 1: body(1, "CANDIDATE")})
    assert not model.sessions[1].closed


def test_redirects_snapshots_and_restarts_from_counter_deltas() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    poll_all(model, 0.0, {0: body(0, "LEADER"), 1: body(1, counters={"redirected_sessions": 4})})
    assert model.members[1].redirects == 4
    assert not model.redirects  # before the console started: counted, not listed
    events = poll_all(
        model,
        0.5,
        {
            0: body(0, "LEADER", snapshots_taken=1),
            1: body(1, counters={"redirected_sessions": 6}, pid=999),
        },
    )
    assert "member 0 took a snapshot at log position 100 (1 since it started)" in events
    assert "member 1 restarted (pid 999)" in events
    events = poll_all(model, 1.0, {1: body(1, counters={"redirected_sessions": 7}, pid=999)})
    assert "member 1 redirected 1 client to leader 0" in events
    assert [(r.member_id, r.count, r.leader_id) for r in model.redirects] == [(1, 1, 0)]


def test_throughput_from_commit_positions() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    for i in range(5):
        leader = body(0, "LEADER", commit_position=1000 * i, ingress={"frames": 10 * i})
        poll_all(model, 0.5 * i, {0: leader})
    assert list(model.bytes_per_s) == [2000.0, 2000.0]
    assert list(model.messages_per_s) == [20.0, 20.0]


def test_errors_after_the_first_fetch_are_events() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    poll_all(model, 0.0, {0: body(0, "LEADER")})
    old = [{"time": 1.0, "level": "WARNING", "logger": "cluster", "message": "old"}]
    assert texts(model.apply_errors(0, old)) == [
        "member 0 logged 1 warning(s)/error(s) before the console started "
        "(cluster-tool errors shows them)"
    ]
    new = [*old, {"time": 2.0, "level": "ERROR", "logger": "cluster", "message": "bad\ntrace"}]
    events = model.apply_errors(0, new)
    assert texts(events) == ["member 0 ERROR: bad"]
    assert events[0].severity == "error"
    assert model.apply_errors(0, new) == []


def test_a_full_disk_marks_the_member_and_is_an_event_when_it_fills_and_clears() -> None:
    model = ClusterModel(MEMBERS)
    poll_all(model, 1.0, {0: body(0, "LEADER"), 1: body(1), 2: body(2)})
    full = {
        "full": True,
        "problem": "disk full: log append of 64 bytes at 100 failed (No space left on device)",
        "failing_for_s": 3.0,
        "failing": ["log"],
    }
    events = poll_all(model, 2.0, {0: body(0, "LEADER", disk=full), 1: body(1), 2: body(2)})
    assert events == [
        "member 0: DISK FULL for 3 s: disk full: log append of 64 bytes at 100 failed "
        "(No space left on device)"
    ]
    assert model.members[0].disk == "disk full"
    assert [m.member_id for m in model.disk_trouble] == [0]
    assert poll_all(model, 3.0, {0: body(0, "LEADER", disk=full)}) == []  # once, not per poll
    events = poll_all(model, 4.0, {0: body(0, "LEADER")})
    assert events == ["member 0: disk writes resumed (disk full before)"]
    assert model.members[0].disk == ""
    assert model.disk_trouble == []
