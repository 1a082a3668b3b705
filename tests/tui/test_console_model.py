"""The console's model: what it derives across ``describe`` polls (no Textual, no I/O)."""

from __future__ import annotations

from typing import Any

import msgspec

from cluster.config import parse_members
from cluster.protocol.admin import MemberStatus
from tui.model import ClusterModel
from tui.render import MEMBER_COLUMNS, member_values
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
    """One polling round (a member gone is told a round later: see ``apply_round``)."""
    polls = [
        MemberPoll(
            mid, at, b if isinstance(b, MemberStatus) else None, b if isinstance(b, str) else ""
        )
        for mid, b in sorted(bodies.items())
    ]
    return texts(model.apply_round(polls))


def test_leader_change_and_down_member() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    first = poll_all(model, 0.0, {0: body(0, "LEADER"), 1: body(1), 2: body(2)})
    assert "leader is member 0, term 0" in first
    assert model.leader_id == 0
    events = poll_all(model, 0.5, {0: "connection refused", 1: body(1), 2: body(2)})
    assert events == []  # told a round later, unless the others follow (a stop)
    assert model.leader_id is None
    assert not model.members[0].up
    events = poll_all(
        model,
        1.0,
        {0: "connection refused", 1: body(1, "LEADER", leadership_term_id=1), 2: body(2)},
    )
    assert events[:2] == [
        "member 0 down: connection refused",
        "no leader: member 0 is down; the others elect a new one",
    ]
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
    assert "member 0 took a snapshot (1 since it started; log now at 100)" in events
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
        "member 0: 1 earlier warning(s)/error(s) (cluster-tool errors)"
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


# ---------------------------------------------------------------------- issue #21: the truth


def three(model: ClusterModel, at: float, leader: dict[str, Any] | None = None) -> list[str]:
    return poll_all(model, at, {0: body(0, "LEADER", **(leader or {})), 1: body(1), 2: body(2)})


def test_a_suspended_leader_is_the_headline_not_a_green_leader() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    three(model, 0.0)
    assert model.headline.state == "LEADER member 0"
    assert model.headline.tone == "ok"
    events = three(model, 0.5, {"module_state": "SUSPENDED"})
    assert "member 0 ACTIVE -> SUSPENDED" in events
    verdict = model.headline
    assert (verdict.state, verdict.tone) == ("SUSPENDED", "warn")
    assert "leader member 0" in verdict.detail
    assert "resumed" in verdict.detail
    three(model, 1.0, {"module_state": "SNAPSHOT"})
    assert model.headline.state == "SNAPSHOT"
    three(model, 1.5, {"module_state": "TERMINATING"})
    assert model.headline.state == "SHUTTING DOWN"
    assert "TERMINATING" in model.headline.detail
    three(model, 2.0)
    assert model.headline.state == "LEADER member 0"


def test_a_clean_shutdown_is_a_shutdown_not_a_crash_and_an_election() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    three(model, 0.0)
    quitting = {"module_state": "TERMINATING"}
    poll_all(
        model,
        0.5,
        {0: body(0, "LEADER", **quitting), 1: body(1, **quitting), 2: body(2, **quitting)},
    )
    events = poll_all(model, 1.0, {i: "connection refused" for i in range(3)})
    assert events == [
        "cluster stopped: all 3 members within one poll, a clean shutdown (members said so "
        "before they went)"
    ]
    assert all(m.stopped == "shut down" for m in model.members.values())
    assert model.headline.state == "SHUT DOWN"


def test_all_members_gone_together_after_a_snapshot_is_a_shutdown() -> None:
    """The nodes' SHUTDOWN takes a snapshot and stops; the console may never see a
    stopping module state, but it sees the snapshots and every member going at once."""
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    three(model, 0.0)
    poll_all(
        model,
        0.5,
        {
            0: body(0, "LEADER", snapshots_taken=1),
            1: body(1, snapshots_taken=1),
            2: body(2, snapshots_taken=1),
        },
    )
    # the leader first, the others a round later: still one stop, not a crash
    assert poll_all(model, 0.75, {0: "connection refused", 1: body(1), 2: body(2)}) == []
    events = poll_all(model, 1.0, {0: "connection refused", 1: "reset", 2: "refused"})
    assert len(events) == 1, events
    assert any("a clean SHUTDOWN" in t for t in events), events
    assert model.headline.state == "SHUT DOWN"
    assert model.stopped_clean
    assert [m.stopped for m in model.members.values()] == ["stopped"] * 3
    # started again: the stop is over
    three(model, 5.0)
    assert model.stopped_at is None
    assert model.headline.state == "LEADER member 0"


def test_a_leader_crash_is_down_and_an_election() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    three(model, 0.0)
    poll_all(model, 0.5, {0: "connection refused", 1: body(1), 2: body(2)})
    events = poll_all(model, 0.75, {0: "connection refused", 1: body(1), 2: body(2)})
    assert "member 0 down: connection refused" in events
    assert "no leader: member 0 is down; the others elect a new one" in events
    assert model.members[0].stopped == ""
    assert model.headline.state == "NO LEADER"
    poll_all(model, 1.0, {1: body(1, "CANDIDATE", election_state="CANVASS"), 2: body(2)})
    assert "election in progress (member 1: CANVASS)" in model.headline.detail
    # the others go much later: not a cluster stopping together
    poll_all(model, 9.0, {1: "connection refused", 2: body(2)})
    poll_all(model, 20.0, {1: "connection refused", 2: "connection refused"})
    assert model.stopped_at is None  # one by one, far apart: not a cluster stopping
    assert model.headline.detail == "no member answers"


def test_sessions_before_the_console_are_a_baseline_not_opened() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    leader = body(0, "LEADER", sessions=[session(1), session(2)])
    events = poll_all(model, 0.0, {0: leader, 1: body(1)})
    assert events.count("2 sessions open when the console started (leader 0)") == 1
    assert not any("opened" in t for t in events)
    assert all(row.existing for row in model.sessions.values())
    events = poll_all(
        model, 0.5, {0: body(0, "LEADER", sessions=[session(1), session(2), session(3)])}
    )
    assert events == ["session 3 opened (127.0.0.1:5003)"]
    assert not model.sessions[3].existing


def test_no_leader_no_snapshot_and_the_console_never_names_a_missing_response() -> None:
    from tui.render import action_text
    from tui.source import ActionResult

    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    assert model.snapshot_target() == (
        None,
        "no leader: nothing sent, so there is no AdminResponse",
    )
    three(model, 0.0)
    assert model.snapshot_target() == (0, "")
    three(model, 0.5, {"module_state": "SUSPENDED"})
    target, why = model.snapshot_target()
    assert target is None
    assert "SUSPENDED" in why
    failed = ActionResult("snapshot", False, "FAILED", "no session: timed out", member_id=0)
    assert action_text(failed) == (
        "snapshot failed, no AdminResponse (member 0): no session: timed out"
    )
    ok = ActionResult("snapshot", True, "OK", "SNAPSHOT taken at log position 9", member_id=0)
    assert action_text(ok).startswith("snapshot: AdminResponse OK (member 0)")


def test_the_consoles_own_session_is_not_a_client_redirect() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    three(model, 0.0)
    # ``s``: the console dials member 0, which lost the lead meanwhile and redirects it
    model.expect_own_session(0, until=30.0)
    events = poll_all(
        model,
        0.5,
        {
            0: body(0, counters={"redirected_sessions": 1}),
            1: body(1, "LEADER", leadership_term_id=1),
        },
    )
    assert "member 0 redirected the console's own session (not a client's)" in events
    assert not any("client" in t and "redirected 1" in t for t in events)
    assert not model.redirects
    assert model.members[0].client_redirects == 0
    # a client's redirect afterwards is one
    events = poll_all(model, 1.0, {0: body(0, counters={"redirected_sessions": 2})})
    assert "member 0 redirected 1 client to leader 0" in events
    assert model.members[0].client_redirects == 1
    # a session that was not redirected owes nothing: a later redirect is a client's
    model.expect_own_session(1, until=30.0)
    model.own_session_done(1, redirected=False, now=2.0)
    events = poll_all(
        model,
        2.5,
        {1: body(1, "LEADER", leadership_term_id=1, counters={"redirected_sessions": 1})},
    )
    assert any(t.startswith("member 1 redirected 1 client") for t in events)


def test_throughput_graph_has_a_scale_and_a_blip_stays_small() -> None:
    from tui.graph import BLOCKS, bars, nice_scale
    from tui.render import graph_text

    assert nice_scale([63.0]) == 1024.0  # the floor: 1 KiB/s
    assert nice_scale([1500.0]) == 2048.0
    assert nice_scale([3000.0]) == 5120.0
    assert nice_scale([9000.0]) == 10240.0
    assert nice_scale([2.5 * 1024 * 1024]) == 5 * 1024 * 1024
    rows = bars([0.0, 63.0, 0.0], 1024.0, height=5, width=3)
    assert [r[1] for r in rows] == [" ", " ", " ", " ", BLOCKS[2]]  # a sliver, not the height
    rows = bars([1024.0], 1024.0, height=2, width=1)
    assert rows == [BLOCKS[8], BLOCKS[8]]
    text = graph_text([63.0, 500.0], width=30).plain.splitlines()
    assert text[0].strip().startswith("1 KiB/s")
    assert text[-1].strip().startswith("0")
    assert len(text) == 5


def histogram(name: str, counts: list[int], total: float, **labels: str) -> dict[str, Any]:
    from cluster.metrics import LATENCY_BOUNDS_S

    full = counts + [0] * (len(LATENCY_BOUNDS_S) + 1 - len(counts))
    return {
        "name": name,
        "labels": labels,
        "bounds": list(LATENCY_BOUNDS_S),
        "counts": full,
        "sum": total,
        "count": sum(full),
    }


def test_fsync_and_duty_cycle_times_from_histogram_deltas() -> None:
    from tui.timings import timing_text

    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0, timing_window=5.0)
    info = {"version": "1.2.3", "uptime_s": 125.0, "archive_bytes": 5 * 1024 * 1024}
    before = [
        histogram("fsync", [0, 0, 0, 0, 0, 0, 0, 0, 1000], 1000 * 2e-3),  # old: 2.56 ms bucket
        histogram("duty_cycle", [500], 500 * 5e-6),
        histogram("replication", [10], 10 * 5e-6, follower="1"),
    ]
    three(model, 0.0, {"histograms": before, **info})
    row = model.members[0]
    assert (row.version, row.uptime_s, row.archive_bytes) == ("1.2.3", 125.0, 5 * 1024 * 1024)
    assert row.fsync is None  # one reading: nothing to compare yet
    after = [
        # 99 fast fsyncs (<= 40 µs) and one of ~1 s since the last poll
        histogram(
            "fsync",
            [0, 0, 99, 0, 0, 0, 0, 0, 1000, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            1000 * 2e-3 + 99 * 30e-6 + 1.0,
        ),
        histogram("duty_cycle", [500, 100], 500 * 5e-6 + 100 * 15e-6),
        histogram("replication", [10, 0, 0, 4], 10 * 5e-6 + 4 * 70e-6, follower="1"),
    ]
    three(model, 1.0, {"histograms": after, **info})
    fsync = model.members[0].fsync
    assert fsync is not None
    assert fsync.count == 100
    assert fsync.p99 == 4e-05  # 99 of 100 at or below the 40 µs bound
    assert fsync.mean is not None
    assert abs(fsync.mean - (99 * 30e-6 + 1.0) / 100) < 1e-9
    cycle = model.members[0].cycle
    assert cycle is not None
    assert cycle.count == 100
    assert cycle.p99 == 2e-5
    assert timing_text(cycle) == "p99≤20µs x̄15µs"
    repl = model.replication_time(1)
    assert repl is not None
    assert repl.count == 4
    assert repl.p99 == 8e-5
    # nothing new: idle, not the old values
    three(model, 2.0, {"histograms": after, **info})
    three(model, 7.5, {"histograms": after, **info})
    assert timing_text(model.members[0].fsync) == "idle"
    # a restart (another pid) starts over
    three(model, 8.0, {"histograms": before, "pid": 555})
    assert model.members[0].fsync is None


def test_follower_lag_seconds_from_the_leader() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    followers = [
        {"member_id": 1, "lag_bytes": 64, "lag_s": 0.25, "last_heard_ms_ago": 3},
        {"member_id": 2, "lag_bytes": 0, "lag_s": 0.0},
    ]
    three(model, 0.0, {"followers": followers})
    assert model.members[1].lag_s == 0.25
    assert model.members[2].lag_s == 0.0
    assert model.members[0].lag_s is None


def test_the_members_left_stopping_together_after_one_was_killed() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    three(model, 0.0)
    poll_all(
        model,
        0.5,
        {0: "connection refused", 1: body(1, "LEADER", leadership_term_id=1), 2: body(2)},
    )
    poll_all(
        model,
        10.0,
        {0: "connection refused", 1: body(1, "LEADER", leadership_term_id=1), 2: body(2)},
    )
    events = poll_all(model, 10.25, {i: "connection refused" for i in range(3)})
    assert events == [
        "cluster stopped: the 2 members up (1, 2; 0 already down) within one poll, a shutdown "
        "(cluster-tool shutdown, Ctrl-C), or their host went away"
    ]
    assert [m.stopped for m in model.members.values()] == ["", "stopped", "stopped"]
    assert model.headline.state == "STOPPED"


def test_the_members_table_shows_each_members_last_snapshot_and_its_age() -> None:
    model = ClusterModel(MEMBERS, wall_clock=lambda: 0.0)
    snap = {"last_snapshot_position": 1_048_576, "last_snapshot_age_s": 182.4}
    poll_all(model, 0.0, {0: body(0, "LEADER", **snap), 1: body(1, **snap), 2: body(2)})
    cells = {mid: dict(member_values(model.members[mid], 0.0)) for mid in range(3)}
    assert str(cells[0]["snapshot"]) == "1,048,576 · 3m02s ago"
    assert str(cells[2]["snapshot"]) == "-"  # none yet (or a member too old to say)
    assert "snapshot" in [key for key, _ in MEMBER_COLUMNS]
