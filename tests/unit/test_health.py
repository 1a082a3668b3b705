"""Truthful health (issue 31): a member's verdict (``/health``, :meth:`MemberStatus.health`)
and the cluster's (``cluster-tool health``) in each state, from constructed statuses."""

from __future__ import annotations

import json

import pytest
import trio

from cluster.agents.exporter import MetricsServer, health
from cluster.config import MemberEndpoints
from cluster.protocol.admin import AdminReply, DiskStatus, FollowerStatus, MemberStatus
from cluster.tool.client import Result
from cluster.tool.render import describe_table, health_document, health_table

FULL = DiskStatus(
    full=True, problem="disk full: log append failed (No space left on device)", free_bytes=0
)
EIO = DiskStatus(problem="disk error: log append failed (Input/output error)")


def leader(member_id: int = 0, **fields: object) -> MemberStatus:
    values: dict[str, object] = {
        "role": "LEADER",
        "leader_member_id": member_id,
        "leadership_term_id": 3,
        "election_state": "CLOSED",
        "sees_quorum": True,
    }
    values.update(fields)
    return MemberStatus(member_id=member_id, **values)  # type: ignore[arg-type]


def follower(member_id: int, leader_id: int = 0, **fields: object) -> MemberStatus:
    values: dict[str, object] = {
        "role": "FOLLOWER",
        "leader_member_id": leader_id,
        "leadership_term_id": 3,
        "election_state": "CLOSED",
        "sees_quorum": True,
    }
    values.update(fields)
    return MemberStatus(member_id=member_id, **values)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- one member


@pytest.mark.parametrize(
    ("status", "ok", "reasons"),
    [
        (leader(), True, ["leader"]),
        (follower(1), True, ["follows leader 0"]),
        (leader(module_state="SUSPENDED"), False, ["suspended"]),
        (follower(1, module_state="SUSPENDED"), False, ["suspended"]),
        (leader(module_state="SNAPSHOT"), False, ["module state SNAPSHOT"]),
        (leader(module_state="QUITTING"), False, ["module state QUITTING"]),
        (follower(1, module_state="TERMINATING"), False, ["module state TERMINATING"]),
        (
            MemberStatus(member_id=0, role="CANDIDATE", election_state="CANVASS"),
            False,
            ["no leader (election CANVASS)"],
        ),
        (
            # an old leader id is still known while the election runs
            follower(1, role="CANDIDATE", election_state="CANDIDATE_BALLOT", sees_quorum=False),
            False,
            ["no leader (election CANDIDATE_BALLOT)"],
        ),
        (
            leader(election_state="LEADER_REPLAY", sees_quorum=False),
            False,
            ["no leader (election LEADER_REPLAY)"],
        ),
        (
            follower(1, leader_id=-1, election_state="INIT", sees_quorum=False),
            False,
            ["no leader (election INIT)"],
        ),
        (
            follower(1, sees_quorum=False),
            False,
            ["no quorum (leader 0 not heard from within the heartbeat timeout)"],
        ),
        (leader(disk=FULL), False, [FULL.problem]),
        (follower(2, disk=EIO), False, [EIO.problem]),
        # a problem not worded with its label gets it
        (
            leader(disk=DiskStatus(full=True, problem="log append failed")),
            False,
            ["disk full: log append failed"],
        ),
        (follower(2, catching_up=True), False, ["catching up"]),
        # every reason, the most basic first
        (
            follower(2, module_state="SUSPENDED", disk=FULL, catching_up=True, sees_quorum=False),
            False,
            [
                "suspended",
                FULL.problem,
                "catching up",
                "no quorum (leader 0 not heard from within the heartbeat timeout)",
            ],
        ),
        # a member too old to say whether it sees a quorum: not judged on it
        (leader(sees_quorum=None), True, ["leader"]),
        (follower(1, sees_quorum=None), True, ["follows leader 0"]),
    ],
)
def test_a_members_health_in_each_state(status: MemberStatus, ok: bool, reasons: list[str]) -> None:
    assert status.health() == (ok, reasons)
    assert health(status, status.sees_quorum is not False) == (ok, "; ".join(reasons))


def test_a_leader_without_a_quorum_says_when_it_heard_from_each_follower() -> None:
    status = leader(
        sees_quorum=False,
        followers=[
            FollowerStatus(member_id=1, last_heard_ms_ago=12_345),
            FollowerStatus(member_id=2),
        ],
    )
    ok, reasons = status.health()
    assert not ok
    (reason,) = reasons
    assert reason.startswith("no quorum (")
    assert "member 1 12345 ms ago" in reason
    assert "member 2 never" in reason


def test_the_live_quorum_view_overrides_the_status() -> None:
    assert leader(sees_quorum=True).health(False)[0] is False
    assert leader(sees_quorum=False).health(True) == (True, ["leader"])
    assert health(leader(sees_quorum=True), False)[1].startswith("no quorum")


def test_a_full_disk_leader_is_unhealthy_though_it_leads() -> None:
    """Issue 31, point 4: it answered 200 {"health": true, "reason": "leader"}."""
    ok, why = health(leader(disk=FULL), True)
    assert (ok, why) == (False, FULL.problem)


# ---------------------------------------------------------------------- /health


async def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reply = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                reply += chunk
    head, body = reply.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(
    ("status", "quorum", "code", "reason"),
    [
        (leader(), True, 200, "leader"),
        (follower(1), True, 200, "follows leader 0"),
        (leader(module_state="SUSPENDED"), True, 503, "suspended"),
        (leader(), False, 503, "no quorum"),
        (leader(disk=FULL), True, 503, "disk full: "),
        (follower(1, catching_up=True), True, 503, "catching up"),
        (
            MemberStatus(member_id=0, role="CANDIDATE", election_state="CANVASS"),
            False,
            503,
            "no leader (election CANVASS)",
        ),
    ],
)
async def test_health_endpoint_answers_the_verdict_and_its_reason(
    status: MemberStatus, quorum: bool, code: int, reason: str
) -> None:
    server = MetricsServer("127.0.0.1", 0, lambda: status, lambda: quorum)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        got, body = await _get(port, "/health")
        nursery.cancel_scope.cancel()
    assert got == code
    assert body["health"] is (code == 200)
    assert isinstance(body["reason"], str)
    assert body["reason"].startswith(reason)
    assert body["reasons"] == status.health(quorum)[1]
    assert body["member"] == status.member_id
    assert body["role"] == status.role
    assert body["module_state"] == status.module_state
    assert body["catching_up"] is status.catching_up


# ---------------------------------------------------------------------- the cluster


def _endpoint(member_id: int) -> MemberEndpoints:
    return MemberEndpoints(member_id, "127.0.0.1", 1, 2, 3)


def up(status: MemberStatus) -> Result:
    reply = AdminReply(1, True, "", b"")
    return Result(_endpoint(status.member_id), reply=reply, status=status)


def down(member_id: int) -> Result:
    return Result(_endpoint(member_id), error="connection refused")


def test_a_healthy_cluster() -> None:
    doc = health_document([up(leader()), up(follower(1)), up(follower(2))], now=0.0)
    assert (doc["healthy"], doc["reason"], doc["problems"]) == (True, "healthy", [])
    assert doc["leader_member_id"] == 0
    assert [m["reason"] for m in doc["members"]] == [
        "leader", "follows leader 0", "follows leader 0",
    ]  # fmt: skip
    assert health_table(doc).splitlines()[-1] == "cluster: healthy"


def test_a_suspended_cluster_is_unhealthy() -> None:
    """Issue 31, point 5: it said healthy."""
    doc = health_document(
        [
            up(leader(module_state="SUSPENDED")),
            up(follower(1, module_state="SUSPENDED")),
            up(follower(2, module_state="SUSPENDED")),
        ]
    )
    assert doc["healthy"] is False
    assert doc["reason"] == "suspended"
    assert doc["problems"] == [f"member {i}: suspended" for i in range(3)]
    assert all(m["reasons"] == ["suspended"] for m in doc["members"])


def test_a_lone_candidate_is_unhealthy() -> None:
    """Issue 31, point 5: a lone CANDIDATE with the others down said healthy."""
    candidate = MemberStatus(member_id=0, role="CANDIDATE", election_state="CANVASS")
    doc = health_document([up(candidate), down(1), down(2)])
    assert doc["healthy"] is False
    assert doc["reason"] == "no leader"
    assert doc["leader_member_id"] == -1
    assert doc["problems"] == [
        "member 0: no leader (election CANVASS)",
        "member 1 down: connection refused",
        "member 2 down: connection refused",
        "no leader",
    ]
    assert doc["members"][1]["reasons"] == ["down: connection refused"]
    assert doc["members"][1]["error"] == "connection refused"


def test_the_leaders_own_trouble_is_the_clusters_reason() -> None:
    for trouble, reason in (
        ({"disk": FULL}, FULL.problem),
        ({"sees_quorum": False}, "no quorum"),
        ({"module_state": "QUITTING"}, "module state QUITTING"),
        ({"election_state": "LEADER_READY", "sees_quorum": False}, "no leader"),
    ):
        doc = health_document([up(leader(**trouble)), up(follower(1)), up(follower(2))])
        assert doc["healthy"] is False, trouble
        assert doc["reason"].startswith(reason), (trouble, doc["reason"])
        assert doc["problems"][0].startswith(f"member 0: {reason}")


def test_an_unhealthy_follower_makes_the_cluster_unhealthy() -> None:
    doc = health_document([up(leader()), up(follower(1)), up(follower(2, catching_up=True))])
    assert (doc["healthy"], doc["reason"]) == (False, "member 2: catching up")
    assert doc["problems"] == ["member 2: catching up"]
    table = health_table(doc)
    assert table.splitlines()[0].split() == ["member", "health", "role", "reason"]
    assert "unhealthy  FOLLOWER  catching up" in table
    assert table.splitlines()[-1] == "cluster: unhealthy: member 2: catching up"


def test_two_leaders_are_unhealthy() -> None:
    stale = leader(1, leadership_term_id=2)
    doc = health_document([up(leader()), up(stale), up(follower(2))])
    assert doc["healthy"] is False
    assert doc["reason"] == "2 leaders"
    assert doc["leader_member_id"] == 0  # the newest term's
    assert doc["problems"] == ["2 leaders: member 0 (term 3), member 1 (term 2)"]


def test_no_member_answered() -> None:
    doc = health_document([down(0), down(1), down(2)])
    assert (doc["healthy"], doc["reason"]) == (False, "no member answered")
    assert doc["problems"][-1] == "no leader"


def test_describe_shows_a_catching_up_member() -> None:
    table = describe_table([up(leader()), up(follower(1, catching_up=True))])
    rows = {line.split()[0]: line for line in table.splitlines()[1:-1]}
    assert "FOLLOWER (catching up)" in rows["1"]
    assert "catching up" not in rows["0"]
