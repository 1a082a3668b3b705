"""``cluster-tool``'s output: the JSON document of every command has fixed keys, the same
with a member down (docs/cluster-tool.md lists them); tables and times are readable; each
command has its own ``--help``.

The members here are fake admin ports (a thread each) that answer every command the way
a member does, and a port nobody listens on (a member that is down)."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fake_admin import admin_ports

from cluster.metrics import LATENCY_BOUNDS_S
from cluster.protocol.admin import (
    AdminCommand,
    AdminReply,
    HistogramStatus,
    MemberAddress,
    MemberStatus,
    StallsStatus,
    StallStatus,
    encode_body,
)
from cluster.tool import main
from cluster.tool.render import duration, iso, iso_ms, table

STATUS_KEYS = {f.name for f in msgspec.structs.fields(MemberStatus)}
T0 = 1_795_000_000.25  # 2026-11-18T11:06:40.250Z

# the documented shapes (docs/cluster-tool.md): change them there and here together
DESCRIBE = {"time", "time_iso", "leader_member_id", "members"}
DESCRIBE_MEMBER = STATUS_KEYS | {"reachable", "error"}
HEALTH = {"time", "time_iso", "healthy", "reason", "leader_member_id", "members", "problems"}
HEALTH_MEMBER = {"member_id", "reachable", "healthy", "role", "error", "reason", "reasons"}
LIST = {"time", "time_iso", "leader_member_id", "view_member_id", "members"}
LIST_MEMBER = {
    "member_id", "host", "ingress_port", "consensus_port", "admin_port", "reachable", "role",
    "error",
}  # fmt: skip
RECORDING_LOG = {"time", "time_iso", "members"}
RECORDING_LOG_MEMBER = {"member_id", "reachable", "error", "entries"}
ENTRY = {
    "index", "recording_id", "leadership_term_id", "term_base_log_position", "log_position",
    "timestamp", "timestamp_iso", "service_id", "entry_type", "type", "valid",
}  # fmt: skip
ERRORS = {"time", "time_iso", "members"}
ERRORS_MEMBER = {
    "member_id", "reachable", "error", "now", "distinct", "evicted", "total", "errors",
}  # fmt: skip
ERROR = {
    "count", "first_time", "first_time_iso", "last_time", "last_time_iso", "level", "logger",
    "message",
}  # fmt: skip
TIMINGS = {"time", "time_iso", "members"}
TIMINGS_MEMBER = {
    "member_id", "reachable", "error", "role", "fsync", "duty_cycle", "commit", "replication",
    "stall",
}  # fmt: skip
SUMMARY = {"count", "mean_s", "p50_s", "p99_s"}
STALLS = {"time", "time_iso", "members"}
STALLS_MEMBER = {"member_id", "reachable", "error", "threshold_s", "busy", "late", "recent"}
STALL = {"at", "at_iso", "kind", "duration_s", "cpu_s", "gc_s", "where"}
ACTION = {"command", "member_id", "ok", "message", "body"}
INVALIDATE = {"members"}
INVALIDATE_MEMBER = {"member_id", "reachable", "ok", "invalidated", "message", "error"}
CERTS = {"out", "folders"}


def status(member_id: int, ports: dict[int, int]) -> MemberStatus:
    return MemberStatus(
        member_id=member_id,
        role="LEADER" if member_id == 0 else "FOLLOWER",
        leadership_term_id=2,
        leader_member_id=0,
        election_state="CLOSED",
        members=[
            MemberAddress(
                member_id=i, host="127.0.0.1", ingress_port=1, consensus_port=2, admin_port=port
            )
            for i, port in sorted(ports.items())
        ],
        uptime_s=75.0,
        histograms=[] if member_id else LEADER_HISTOGRAMS,
        stalls=StallsStatus(
            threshold_s=0.005,
            busy=1,
            recent=[StallStatus(at=T0, kind="busy", duration_s=0.02, cpu_s=0.019, where="x")],
        ),
    )


def _histogram(name: str, **labels: str) -> HistogramStatus:
    counts = [0] * (len(LATENCY_BOUNDS_S) + 1)
    counts[6] = 3  # three values in the bucket up to 0.64 ms
    return HistogramStatus(
        name=name, labels=labels, bounds=list(LATENCY_BOUNDS_S), counts=counts, sum=0.0015, count=3
    )


LEADER_HISTOGRAMS = [
    _histogram("fsync"),
    _histogram("duty_cycle"),
    _histogram("commit"),
    _histogram("replication", follower="1"),
    _histogram("stall"),
]


ENTRIES = [
    {"index": 0, "recording_id": 0, "leadership_term_id": 0, "term_base_log_position": 0,
     "log_position": -1, "timestamp": int(T0 * 1000), "service_id": -1, "entry_type": 0,
     "type": "TERM", "valid": True},
    {"index": 1, "recording_id": 0, "leadership_term_id": 0, "term_base_log_position": 0,
     "log_position": 640, "timestamp": int(T0 * 1000) + 5000, "service_id": -1,
     "entry_type": 1, "type": "SNAPSHOT", "valid": False},
]  # fmt: skip
RECORDS = [
    {"time": T0 + 60, "first_time": T0, "last_time": T0 + 60, "count": 9000,
     "level": "WARNING", "logger": "cluster.ingress",
     "message": "closing ingress connection after bad frame: bad length"},
    {"time": T0 + 61, "first_time": T0 + 61, "last_time": T0 + 61, "count": 1,
     "level": "ERROR", "logger": "cluster.node",
     "message": "agent failed\nTraceback (most recent call last):\n  ...\nValueError: x"},
]  # fmt: skip


def answer(me: int, ports: dict[int, int], command: AdminCommand) -> AdminReply:
    """What fake member ``me`` of a cluster whose admin ports are ``ports`` answers."""
    cid, name = command.correlation_id, command.command
    if name == "describe":
        return AdminReply(cid, True, "", encode_body(status(me, ports)))
    if name == "recording-log":
        return AdminReply(cid, True, "", encode_body(ENTRIES))
    if name == "errors":
        body: Any = RECORDS
        if command.args.get("summary") == "1":
            body = {"entries": RECORDS, "distinct": 2, "evicted": 3, "total": 9004}
        return AdminReply(cid, True, "DISK FULL for 3 s: no space", encode_body(body))
    if name == "invalidate-latest-snapshot":
        body = {"invalidated": True}
        return AdminReply(cid, True, "invalidate latest snapshot: true", encode_body(body))
    if name == "snapshot":
        body = {"log_position": 640, "leadership_term_id": 2}
        return AdminReply(cid, True, "SNAPSHOT applied successfully", encode_body(body))
    return AdminReply(cid, True, f"{name.upper()} applied successfully")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def cluster(up: int = 2, down: int = 1) -> Iterator[str]:
    """``--members`` of ``up`` answering members (0 leads) and ``down`` dead ones."""
    ports: dict[int, int] = {}
    with admin_ports(*(partial(answer, i, ports) for i in range(up))) as listening:
        ports.update(enumerate(listening))
        for i in range(up, up + down):
            ports[i] = free_port()
        yield ",".join(f"{i}=127.0.0.1:1:2:{p}" for i, p in sorted(ports.items()))


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


# ---------------------------------------------------------------------- JSON shapes


def test_every_commands_json_has_fixed_keys_with_a_member_down(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cluster() as members:
        base = ["--members", members, "--timeout", "2s"]

        code, doc = run_json(capsys, *base, "--output", "json", "describe")
        assert code == 1  # a member is down
        assert set(doc) == DESCRIBE
        assert [set(m) for m in doc["members"]] == [DESCRIBE_MEMBER] * 3
        down = doc["members"][2]
        assert (down["member_id"], down["reachable"], down["role"]) == (2, False, None)
        assert down["error"]
        assert doc["members"][0]["error"] is None
        assert doc["leader_member_id"] == 0

        code, doc = run_json(capsys, *base, "health", "--json")
        assert code == 1
        assert set(doc) == HEALTH
        assert [set(m) for m in doc["members"]] == [HEALTH_MEMBER] * 3
        assert doc["healthy"] is False
        assert doc["problems"] == [f"member 2 down: {doc['members'][2]['error']}"]

        code, doc = run_json(capsys, *base, "--json", "list-members")
        assert code == 0
        assert set(doc) == LIST
        assert [set(m) for m in doc["members"]] == [LIST_MEMBER] * 3
        assert doc["view_member_id"] == 0
        assert [m["reachable"] for m in doc["members"]] == [True, True, False]

        code, doc = run_json(capsys, *base, "--json", "recording-log")
        assert code == 0
        assert set(doc) == RECORDING_LOG
        assert [set(m) for m in doc["members"]] == [RECORDING_LOG_MEMBER] * 3
        assert [set(e) for e in doc["members"][0]["entries"]] == [ENTRY] * 2
        assert doc["members"][0]["entries"][0]["timestamp_iso"] == "2026-11-18T11:06:40.250Z"
        assert doc["members"][2]["entries"] == []

        code, doc = run_json(capsys, *base, "--json", "errors")
        assert code == 0
        assert set(doc) == ERRORS
        assert [set(m) for m in doc["members"]] == [ERRORS_MEMBER] * 3
        first = doc["members"][0]
        assert [set(e) for e in first["errors"]] == [ERROR] * 2
        assert (first["now"], first["distinct"], first["evicted"]) == (
            "DISK FULL for 3 s: no space", 2, 3,
        )  # fmt: skip
        assert first["errors"][0]["count"] == 9000
        assert first["errors"][0]["first_time_iso"] == "2026-11-18T11:06:40.250Z"
        assert doc["members"][2]["errors"] == []
        assert doc["members"][2]["now"] is None

        code, doc = run_json(capsys, *base, "--json", "timings")
        assert code == 1  # a member is down
        assert set(doc) == TIMINGS
        assert [set(m) for m in doc["members"]] == [TIMINGS_MEMBER] * 3
        leader = doc["members"][0]
        assert set(leader["fsync"]) == SUMMARY
        assert set(leader["replication"]["1"]) == SUMMARY
        assert leader["fsync"]["count"] == 3
        assert leader["fsync"]["p99_s"] == 0.00064
        assert doc["members"][2]["fsync"] is None
        assert doc["members"][2]["replication"] == {}

        code, doc = run_json(capsys, *base, "--json", "stalls", "--member", "0")
        assert code == 0
        assert set(doc) == STALLS
        assert [set(m) for m in doc["members"]] == [STALLS_MEMBER]
        assert [set(x) for x in doc["members"][0]["recent"]] == [STALL]
        assert doc["members"][0]["recent"][0]["at_iso"] == "2026-11-18T11:06:40.250Z"

        for command in ("snapshot", "suspend", "resume", "shutdown", "abort"):
            code, doc = run_json(capsys, *base, "--json", command)
            assert code == 0, command
            assert set(doc) == ACTION
            assert (doc["command"], doc["member_id"], doc["ok"]) == (command, 0, True)
            if command == "snapshot":
                assert doc["body"] == {"log_position": 640, "leadership_term_id": 2}
            else:
                assert doc["body"] is None
        code, doc = run_json(capsys, *base, "--json", "suspend", "--member", "2")
        assert code == 1
        assert set(doc) == ACTION
        assert (doc["member_id"], doc["ok"]) == (2, False)
        assert doc["message"].startswith("unreachable")

        code, doc = run_json(capsys, *base, "--json", "invalidate-latest-snapshot")
        assert code == 1  # member 2 could not
        assert set(doc) == INVALIDATE
        assert [set(m) for m in doc["members"]] == [INVALIDATE_MEMBER] * 3
        assert [m["invalidated"] for m in doc["members"]] == [True, True, None]


def test_with_no_leader_an_action_is_still_one_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cluster(up=0, down=2) as members:
        code, doc = run_json(capsys, "--members", members, "--json", "--timeout", "1s", "snapshot")
        assert code == 1
        assert set(doc) == ACTION
        assert (doc["member_id"], doc["ok"]) == (None, False)
        assert doc["message"].startswith("no leader found")
        code, doc = run_json(capsys, "--members", members, "--json", "list-members")
        assert code == 1
        assert set(doc) == LIST
        assert doc["view_member_id"] is None
        assert [set(m) for m in doc["members"]] == [LIST_MEMBER] * 2


def test_certs_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    argv = ["certs", "--members", "0=127.0.0.1:1:2:3", "--out", str(out), "--output", "json"]
    code, doc = run_json(capsys, *argv)
    assert code == 0
    assert set(doc) == CERTS
    assert doc["folders"][0] == {"path": str(out / "member-0"), "created": True}
    assert {f["created"] for f in run_json(capsys, *argv)[1]["folders"]} == {False}


# ---------------------------------------------------------------------- tables


def test_tables_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    with cluster() as members:
        base = ["--members", members, "--timeout", "2s"]
        assert main([*base, "list-members"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == [
            "member", "host", "ingress", "consensus", "admin", "role", "status",
        ]  # fmt: skip
        assert lines[1].split()[5:] == ["LEADER", "up"]
        assert lines[3].split()[5:7] == ["-", "down"]
        assert lines[-1] == "leader: 0 (as member 0 sees it)"

        assert main([*base, "recording-log", "--member", "1"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "Member [1]: 2 entries"
        assert lines[1].split()[:2] == ["index", "type"]
        assert lines[2].split() == [
            "0", "TERM", "0", "0", "-1", "2026-11-18T11:06:40.250Z", "-1", "0", "yes",
        ]  # fmt: skip
        assert "2026-11-18T11:06:45.250Z" in lines[3]
        assert lines[3].split()[-1] == "no"

        assert main([*base, "errors"]) == 0
        out = capsys.readouterr().out
        assert "Member [0]: 2 distinct errors (3 older ones evicted)" in out
        assert "  NOW: DISK FULL for 3 s: no space" in out
        assert "Member [2]: unreachable (" in out
        rows = [line.split(maxsplit=5) for line in out.splitlines() if "cluster.ingress" in line]
        assert rows[0] == [
            "9000", "2026-11-18T11:06:40Z", "2026-11-18T11:07:40Z", "WARNING", "cluster.ingress",
            "closing ingress connection after bad frame: bad length",
        ]  # fmt: skip
        assert "agent failed (+3 lines)" in out  # the traceback is in --output json

        assert main([*base, "health"]) == 1
        out = capsys.readouterr().out
        assert out.splitlines()[0].split() == ["member", "health", "role", "reason"]
        assert out.splitlines()[-1].startswith("cluster: unhealthy: member 2 down: ")


def test_readable_times_and_durations() -> None:
    assert iso(T0) == "2026-11-18T11:06:40.250Z"
    assert iso_ms(int(T0 * 1000)) == "2026-11-18T11:06:40.250Z"
    assert iso(None) is None
    assert [duration(s) for s in (5, 75, 3 * 3600 + 420, 2 * 86400 + 4 * 3600)] == [
        "5s", "1m15s", "3h07m", "2d04h",
    ]  # fmt: skip
    assert table(("a", "bb"), [("ccc", "d")]) == "a    bb\nccc  d"


# ---------------------------------------------------------------------- the command line


def help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_each_command_has_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    describe = help_of(capsys, "describe")
    assert "usage: cluster-tool describe" in describe
    assert "--member N" in describe
    for other in ("--snapshot-timeout", "--out OUT", "--days", "--client", "--limit"):
        assert other not in describe
    assert "--snapshot-timeout" in help_of(capsys, "snapshot")
    assert "--limit" in help_of(capsys, "errors")
    health = help_of(capsys, "health")
    assert "--member N" not in health
    assert "--output" in health
    certs = help_of(capsys, "certs")
    assert "--out OUT" in certs
    assert "--timeout" not in certs
    top = help_of(capsys)
    for command in ("describe", "health", "list-members", "errors", "certs"):
        assert command in top


@pytest.mark.parametrize(
    "argv",
    [
        ["health", "--member", "0"],  # health asks every member
        ["--member", "0", "health"],
        ["describe", "--snapshot-timeout", "5s"],
        ["describe", "--out", "x"],
        ["--output", "yaml", "describe"],
        ["errors", "--limit", "many"],
        ["errors", "--limit", "0"],
    ],
)
def test_options_of_other_commands_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--members", "0=127.0.0.1:1:2:3", *argv])
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_common_options_before_or_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with cluster(up=1, down=0) as members:
        for argv in (
            ["--members", members, "--json", "health"],
            ["health", "--members", members, "--output", "json"],
            ["--members", "0=127.0.0.1:1:2:3", "--timeout", "9s", "health", "--members", members,
             "--json", "--timeout", "2s"],
            ["--output", "json", "--members", members, "health", "--output", "json"],
        ):  # fmt: skip
            code, doc = run_json(capsys, *argv)
            assert (code, doc["healthy"]) == (0, True), argv
        assert main(["--json", "--members", members, "health", "--output", "table"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "cluster: healthy"
        # the old spellings: --member and --snapshot-timeout before the command
        code, doc = run_json(capsys, "--members", members, "--json", "--member", "0", "describe")
        assert (code, len(doc["members"])) == (0, 1)
        code, doc = run_json(
            capsys, "--members", members, "--snapshot-timeout", "5s", "--json", "snapshot"
        )
        assert (code, doc["ok"]) == (0, True)


# ---------------------------------------------------------------------- the documentation


def documented_shapes() -> dict[str, Any]:
    """The JSON example under each ``### `command` `` heading of docs/cluster-tool.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "cluster-tool.md").read_text()
    found: dict[str, Any] = {}
    for section in text.split("\n### `")[1:]:
        name = section.split("`", 1)[0]
        block = re.search(r"```json\n(.*?)```", section, re.S)
        assert block is not None, name
        found[name] = json.loads(block[1])
    return found


def test_the_documented_shapes_are_the_pinned_ones() -> None:
    docs = documented_shapes()
    assert set(docs) == {
        "describe", "health", "list-members", "recording-log", "errors", "snapshot",
        "invalidate-latest-snapshot", "certs", "timings", "stalls",
    }  # fmt: skip
    assert set(docs["describe"]) == DESCRIBE
    for member in docs["describe"]["members"]:  # elided with "...": a subset
        assert set(member) - {"..."} <= DESCRIBE_MEMBER
        assert {"member_id", "role", "reachable", "error"} <= set(member)
    for name, top, member in (
        ("health", HEALTH, HEALTH_MEMBER),
        ("list-members", LIST, LIST_MEMBER),
        ("recording-log", RECORDING_LOG, RECORDING_LOG_MEMBER),
        ("errors", ERRORS, ERRORS_MEMBER),
        ("invalidate-latest-snapshot", INVALIDATE, INVALIDATE_MEMBER),
        ("timings", TIMINGS, TIMINGS_MEMBER),
        ("stalls", STALLS, STALLS_MEMBER),
    ):
        assert set(docs[name]) == top, name
        assert all(set(m) == member for m in docs[name]["members"]), name
    assert all(set(e) == ENTRY for e in docs["recording-log"]["members"][0]["entries"])
    assert all(set(e) == ERROR for e in docs["errors"]["members"][0]["errors"])
    assert all(set(x) == STALL for x in docs["stalls"]["members"][0]["recent"])
    assert set(docs["timings"]["members"][0]["fsync"]) == SUMMARY
    assert set(docs["snapshot"]) == ACTION
    assert set(docs["certs"]) == CERTS
    assert set(docs["certs"]["folders"][0]) == {"path", "created"}
