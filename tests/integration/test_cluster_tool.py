"""``cluster-tool`` against a 3-member cluster of real ``python -m cluster.node`` processes.

The tool runs as a subprocess (``python -m cluster.tool``), the way an operator runs it,
and talks to every member's admin port.  Slow-marked: skip locally with ``-m "not slow"``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import trio

import client
from cluster.config import parse_members
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"
BAD_CLIENTS = 25
START_UP_WARNING = "no authenticator enforces client identity"
NODE_ARGS = ["--leader-heartbeat-timeout", "1s"]  # and the start-up canvass's 500 ms


# ---------------------------------------------------------------------- helpers


@contextmanager
def local_cluster(directory: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(3, KV, directory, extra_args=NODE_ARGS)
    try:
        cluster.start_all(timeout=20)
        yield cluster
    finally:
        for proc in cluster.processes.values():  # a frozen member would ignore SIGTERM
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
        cluster.stop_all()


def tool(
    cluster: LocalCluster, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m cluster.tool --members ... ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tool_json(cluster: LocalCluster, *args: str, code: int = 0) -> Any:
    result = tool(cluster, "--json", *args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def describe(cluster: LocalCluster) -> dict[str, Any]:
    result = tool(cluster, "--json", "describe")  # exit 1 while a member is down
    assert result.returncode in (0, 1), (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def settled(document: dict[str, Any], member_ids: set[int]) -> bool:
    """One leader, every listed member reachable, following it in the same term."""
    members = {m["member_id"]: m for m in document["members"]}
    if not all(members[i]["reachable"] for i in member_ids):
        return False
    leaders = [i for i in member_ids if members[i]["role"] == "LEADER"]
    if len(leaders) != 1 or document["leader_member_id"] != leaders[0]:
        return False
    terms = {members[i]["leadership_term_id"] for i in member_ids}
    return (
        len(terms) == 1
        and all(members[i]["election_state"] == "CLOSED" for i in member_ids)
        and all(members[i]["leader_member_id"] == leaders[0] for i in member_ids)
    )


def wait_settled(
    cluster: LocalCluster, member_ids: set[int] | None = None, limit: float = 30
) -> dict[str, Any]:
    ids = member_ids if member_ids is not None else set(range(cluster.nodes))
    deadline = time.monotonic() + limit
    while True:
        document = describe(cluster)
        if settled(document, ids):
            return document
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster did not settle: {json.dumps(document, indent=1)}")
        time.sleep(0.2)


def wait_until(predicate: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit}s waiting for {what}")
        time.sleep(0.1)


def bad_frames(document: dict[str, Any]) -> int:
    errors = document["members"][0]["errors"]
    return sum(e["count"] for e in errors if "bad frame" in e["message"])


def node_log(cluster: LocalCluster, member_id: int) -> str:
    return (cluster.log_dir / f"node-{member_id}.log").read_text(errors="replace")


def snapshot_files(cluster: LocalCluster, member_id: int) -> list[str]:
    directory = cluster.directory / f"node-{member_id}" / "snapshots"
    return sorted(p.name for p in directory.glob("*.snap")) if directory.exists() else []


@asynccontextmanager
async def kv_session(endpoints: str) -> AsyncIterator[KeyValueClient]:
    """A KV client whose first put went through (a connect may be retried once or twice
    right after start-up, like the failover tests do)."""
    async with AsyncExitStack() as stack:
        for attempt in itertools.count(1):
            try:
                c = await stack.enter_async_context(client.connect(endpoints, connect_timeout=8))
                break
            except client.ConnectTimeoutError:
                if attempt >= 3:
                    raise
        kv = await stack.enter_async_context(KeyValueClient(c))
        await kv.put("warm-up", b"1")
        yield kv


async def run_tool(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: tool(cluster, *args))


# ---------------------------------------------------------------------- tests


def test_describe_snapshot_recording_log_errors_and_invalidate(tmp_path: Path) -> None:
    with local_cluster(tmp_path) as cluster:
        document = wait_settled(cluster)
        members = document["members"]
        assert [m["member_id"] for m in members] == [0, 1, 2]
        assert sum(m["role"] == "LEADER" for m in members) == 1
        leader = document["leader_member_id"]
        assert {m["leadership_term_id"] for m in members} == {members[leader]["leadership_term_id"]}
        for m in members:
            assert m["reachable"] is True
            assert m["commit_position"] >= 0
            assert m["append_position"] >= m["commit_position"]
            assert m["module_state"] == "ACTIVE"
            assert m["pid"] == cluster.processes[m["member_id"]].pid
            assert {"counters", "ingress", "links", "sessions", "uptime_s"} <= m.keys()
        followers = {f["member_id"] for f in members[leader]["followers"]}
        assert followers == {0, 1, 2} - {leader}

        async def writes() -> None:
            async with kv_session(cluster.ingress_endpoints) as kv:
                for i in range(20):
                    await kv.put(f"key-{i}", f"value-{i}".encode())

        trio.run(writes)
        described = describe(cluster)
        commits = {m["commit_position"] for m in described["members"]}
        assert min(commits) > 0

        table = tool(cluster, "describe")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        header = ["member", "role", "term", "commit", "append", "snapshot", "election"]
        assert lines[0].split()[:7] == header
        assert sum("LEADER" in line for line in lines) == 1
        assert sum(line.rstrip().endswith("up") for line in lines) == 3
        print("\n" + table.stdout)

        listed = tool(cluster, "list-members")
        assert listed.returncode == 0, listed.stderr
        rows = listed.stdout.splitlines()
        assert rows[0].split() == [
            "member", "host", "ingress", "consensus", "admin", "role", "status",
        ]  # fmt: skip
        assert [row.split()[-1] for row in rows[1:4]] == ["up"] * 3
        assert rows[1 + leader].split()[5] == "LEADER"
        assert rows[-1] == f"leader: {leader} (as member {leader} sees it)"
        print("\n" + listed.stdout)

        # a snapshot, taken on every member at the same log position
        snap = tool(cluster, "snapshot")
        assert snap.returncode == 0, snap.stderr
        assert f"Member [{leader}]: SNAPSHOT applied successfully" in snap.stdout
        wait_until(
            lambda: all(len(snapshot_files(cluster, i)) == 1 for i in range(3)),
            10,
            "a snapshot file on every member",
        )
        assert len({snapshot_files(cluster, i)[0] for i in range(3)}) == 1
        logs = tool_json(cluster, "recording-log")["members"]
        for member in logs:
            snapshots = [e for e in member["entries"] if e["type"] == "SNAPSHOT"]
            assert sorted(e["service_id"] for e in snapshots) == [-1, 0], member
            assert all(e["valid"] for e in snapshots)
            assert [e for e in member["entries"] if e["type"] == "TERM"]
        for entry in logs[0]["entries"]:  # epoch milliseconds, and the same in UTC
            stamp = dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC)
            assert entry["timestamp_iso"] == stamp.isoformat(timespec="milliseconds")[:-6] + "Z"
            assert abs(entry["timestamp"] / 1000 - time.time()) < 600
        text = tool(cluster, "recording-log", "--member", "1")
        assert text.returncode == 0
        snapshot_rows = [line.split() for line in text.stdout.splitlines() if "SNAPSHOT" in line]
        assert len(snapshot_rows) == 2
        assert all(row[-1] == "yes" for row in snapshot_rows)
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row[5])
                   for row in snapshot_rows)  # fmt: skip
        print("\n" + text.stdout)

        # refusals: a follower is not the leader
        follower = next(i for i in range(3) if i != leader)
        refused = tool(cluster, "snapshot", "--member", str(follower))
        assert refused.returncode == 1
        assert (
            f"Current node is not the leader (leaderMemberId = {leader}), unable to SNAPSHOT"
            in refused.stderr
        )

        # errors: bad frames on the leader's ingress port are one warning with a count
        ingress = parse_members(cluster.members)[leader]
        for _ in range(BAD_CLIENTS):
            with socket.create_connection((ingress.host, ingress.ingress_port)) as sock:
                sock.sendall(b"\xff\xff\xff\x7fnot a frame")
                sock.settimeout(5)
                with suppress(OSError):
                    sock.recv(10)
        wait_until(
            lambda: (
                bad_frames(tool_json(cluster, "errors", "--member", str(leader))) >= BAD_CLIENTS
            ),
            10,
            "the bad frames in the leader's errors",
        )
        errors = tool_json(cluster, "errors", "--member", str(leader))["members"][0]["errors"]
        [entry] = [e for e in errors if "bad frame" in e["message"]]
        assert entry["level"] == "WARNING"
        assert entry["logger"] == "cluster.ingress"
        assert entry["count"] == BAD_CLIENTS
        assert entry["first_time"] <= entry["last_time"]
        assert entry["last_time_iso"].endswith("Z")
        # the start-up warning, logged before the admin port was served, on every member
        for member in tool_json(cluster, "errors")["members"]:
            assert any(START_UP_WARNING in e["message"] for e in member["errors"]), member
        text = tool(cluster, "errors")
        assert text.returncode == 0
        [row] = [line for line in text.stdout.splitlines() if "bad frame" in line]
        assert row.split()[0] == str(BAD_CLIENTS)
        assert row.split()[3:5] == ["WARNING", "cluster.ingress"]
        assert text.stdout.count(START_UP_WARNING) == 3
        print("\n" + text.stdout)

        # invalidate the latest snapshot on every member
        result = tool(cluster, "invalidate-latest-snapshot")
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("invalidate latest snapshot: true") == 3
        again = tool_json(cluster, "invalidate-latest-snapshot", "--member", "0")
        assert again["members"] == [
            {
                "member_id": 0,
                "reachable": True,
                "ok": True,
                "invalidated": False,
                "message": "invalidate latest snapshot: false",
                "error": None,
            }
        ]
        for member in tool_json(cluster, "recording-log")["members"]:
            snapshots = [e for e in member["entries"] if e["type"] == "SNAPSHOT"]
            assert snapshots
            assert not any(e["valid"] for e in snapshots)


def test_suspend_holds_writes_until_resume_then_abort(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(90):
            async with kv_session(cluster.ingress_endpoints) as kv:
                result = await run_tool(cluster, "suspend")
                assert result.returncode == 0, result.stderr
                assert "SUSPEND applied successfully" in result.stdout
                document = await trio.to_thread.run_sync(describe, cluster)
                leader = document["members"][document["leader_member_id"]]
                assert leader["module_state"] == "SUSPENDED"

                again = await run_tool(cluster, "suspend")
                assert again.returncode == 1
                assert (
                    "Unable to SUSPEND as the state of the consensus module is SUSPENDED, "
                    "but needs to be ACTIVE" in again.stderr
                )
                refused = await run_tool(cluster, "snapshot")
                assert refused.returncode == 1
                assert (
                    "Unable to SNAPSHOT as the state of the consensus module is SUSPENDED, "
                    "but needs to be ACTIVE" in refused.stderr
                )

                done = trio.Event()

                async def put() -> None:
                    await kv.put("held", b"while suspended")
                    done.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(put)
                    with trio.move_on_after(2.0):
                        await done.wait()
                    assert not done.is_set(), "a put completed while the cluster was suspended"
                    resumed = await run_tool(cluster, "resume")
                    assert resumed.returncode == 0, resumed.stderr
                    assert "RESUME applied successfully" in resumed.stdout
                    with trio.fail_after(10):
                        await done.wait()
                assert await kv.get("held") == b"while suspended"

                not_suspended = await run_tool(cluster, "resume")
                assert not_suspended.returncode == 1
                assert "needs to be SUSPENDED" in not_suspended.stderr

        aborted = await run_tool(cluster, "abort")
        assert aborted.returncode == 0, aborted.stderr
        assert "ABORT applied successfully" in aborted.stdout

    with local_cluster(tmp_path) as cluster:
        wait_settled(cluster)
        trio.run(main, cluster)
        processes = dict(cluster.processes)
        for proc in processes.values():
            assert proc.wait(20) == 0
        for member_id in processes:
            assert snapshot_files(cluster, member_id) == []  # ABORT takes no snapshot


def test_killed_and_frozen_members_show_as_unreachable(tmp_path: Path) -> None:
    with local_cluster(tmp_path) as cluster:
        leader = wait_settled(cluster)["leader_member_id"]
        follower = next(i for i in range(3) if i != leader)
        cluster.kill(follower)

        result = tool(cluster, "describe")
        assert result.returncode == 1, result.stderr  # a member is down
        assert "Traceback" not in result.stderr
        row = next(line for line in result.stdout.splitlines() if line.startswith(str(follower)))
        assert "down" in row
        document = tool_json(cluster, "describe", code=1)
        members = {m["member_id"]: m for m in document["members"]}
        assert members[follower]["reachable"] is False
        assert members[follower]["error"]
        assert members[follower]["role"] is None
        assert members[follower].keys() == members[leader].keys()  # the same shape
        assert document["leader_member_id"] == leader
        assert all(members[i]["reachable"] for i in range(3) if i != follower)
        health = tool_json(cluster, "health", code=1)
        assert health["healthy"] is False
        assert health["problems"] == [f"member {follower} down: {members[follower]['error']}"]
        # the other queries: the down member has the same keys as the others, and an error
        for command, key in (("recording-log", "entries"), ("errors", "errors")):
            items = {m["member_id"]: m for m in tool_json(cluster, command)["members"]}
            assert items[follower].keys() == items[leader].keys(), command
            assert items[follower][key] == []
            assert items[follower]["error"]
            assert items[leader]["error"] is None
        listed = {m["member_id"]: m for m in tool_json(cluster, "list-members")["members"]}
        assert listed[follower]["reachable"] is False
        assert listed[follower].keys() == listed[leader].keys()

        # the leader still commits with two of three
        snap = tool(cluster, "snapshot")
        assert snap.returncode == 0, snap.stderr

        # a frozen member accepts the connection but never answers: down after --timeout
        other = next(i for i in range(3) if i not in (leader, follower))
        cluster.signal(other, signal.SIGSTOP)
        try:
            started = time.monotonic()
            frozen = tool(cluster, "--json", "--timeout", "1s", "describe")
            assert time.monotonic() - started < 10
            assert frozen.returncode == 1, frozen.stderr
            members = {m["member_id"]: m for m in json.loads(frozen.stdout)["members"]}
            assert members[other]["reachable"] is False
            assert "no reply within 1s" in members[other]["error"]
        finally:
            cluster.signal(other, signal.SIGCONT)


def test_shutdown_stops_every_member_and_restart_loads_the_snapshot(tmp_path: Path) -> None:
    async def write(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints) as kv:
            for i in range(10):
                await kv.put(f"key-{i}", f"value-{i}".encode())

    async def read(cluster: LocalCluster) -> list[bytes | None]:
        async with kv_session(cluster.ingress_endpoints) as kv:
            return [await kv.get(f"key-{i}") for i in range(10)]

    with local_cluster(tmp_path) as cluster:
        wait_settled(cluster)
        trio.run(write, cluster)
        result = tool(cluster, "shutdown")
        assert result.returncode == 0, result.stderr
        assert "SHUTDOWN applied successfully" in result.stdout
        processes = dict(cluster.processes)
        for proc in processes.values():
            assert proc.wait(20) == 0
        for member_id in processes:
            assert len(snapshot_files(cluster, member_id)) == 1
            assert "snapshot taken, stopping" in node_log(cluster, member_id)
        cluster.processes.clear()

        down = tool(cluster, "--timeout", "1s", "describe")
        assert down.returncode == 1  # nobody answered
        assert down.stdout.count("down") == 3

        cluster.start_all(timeout=20)
        wait_settled(cluster)
        for member_id in range(3):
            assert "loaded snapshot at log position" in node_log(cluster, member_id)
        assert trio.run(read, cluster) == [f"value-{i}".encode() for i in range(10)]
