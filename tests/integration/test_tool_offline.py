"""``cluster-tool``'s commands on a data directory (``pid``, ``verify``,
``recovery-plan``, ``describe-snapshot``) and ``is-leader --member N`` (issue 34; Aeron's
ClusterTool has them), against real processes and their directories."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from test_failover import kv_session, local_cluster

from cluster.local import LocalCluster

pytestmark = pytest.mark.slow


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def leader(cluster: LocalCluster) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = tool("--members", cluster.members, "describe", "--json")
        found = json.loads(done.stdout).get("leader_member_id", -1) if done.stdout else -1
        if found is not None and found >= 0:
            return int(found)
        time.sleep(0.2)
    raise AssertionError("no leader")


def test_pid_names_each_members_process_and_is_leader_says_who_leads(tmp_path: Path) -> None:
    with local_cluster(3, tmp_path) as cluster:
        for member, proc in cluster.processes.items():
            done = tool("pid", "--dir", str(tmp_path / f"node-{member}"))
            assert (done.returncode, done.stdout.strip()) == (0, str(proc.pid)), done.stderr
            document = json.loads(
                tool("pid", "--dir", str(tmp_path / f"node-{member}"), "--json").stdout
            )
            assert document["member_id"] == member
        lead = leader(cluster)
        answers = {
            m: tool("--members", cluster.members, "is-leader", "--member", str(m))
            for m in cluster.processes
        }
        assert [m for m, done in answers.items() if done.returncode == 0] == [lead]
        follower = next(m for m in answers if m != lead)
        assert "not the leader" in answers[follower].stdout
        cluster.stop(follower)
        stopped = tool("pid", "--dir", str(tmp_path / f"node-{follower}"))
        assert stopped.returncode == 1
        assert "no process holds" in stopped.stdout
        down = tool("--members", cluster.members, "is-leader", "--member", str(follower))
        assert down.returncode == 1
    assert tool("pid", "--dir", str(tmp_path / "nothing-here")).returncode == 2


def test_verify_recovery_plan_and_describe_snapshot_read_a_stopped_members_directory(
    tmp_path: Path,
) -> None:
    async def write(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for i in range(300):
                await kv.put(f"k{i}", b"v" * 100, ttl=3600 if i < 5 else None)
            assert tool("--members", cluster.members, "snapshot").returncode == 0
            for i in range(100):
                await kv.put(f"after-{i}", b"w" * 100)

    with local_cluster(3, tmp_path) as cluster:
        trio.run(write, cluster)
    node = tmp_path / "node-0"
    before = sorted((p.name, p.stat().st_size) for p in node.rglob("*") if p.is_file())

    done = tool("verify", "--dir", str(node), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["ok"]
    assert document["records"] > 400
    assert document["snapshots"]

    plan = json.loads(tool("recovery-plan", "--dir", str(node), "--json").stdout)
    snapshot = plan["snapshot"]
    assert snapshot is not None
    assert plan["replay"]["from"] == snapshot["log_position"]
    assert plan["replay"]["to"] == document["log_end"]
    assert plan["replay"]["bytes"] > 100 * 100  # the puts after the snapshot

    described = json.loads(tool("describe-snapshot", "--dir", str(node), "--json").stdout)
    assert described["log_position"] == snapshot["log_position"]
    assert len(described["sessions"]) >= 1  # the writer's session
    assert len(described["timers"]) == 5  # the keys with a time to live
    assert described["service_state_bytes"] > 300 * 100
    for command in ("verify", "recovery-plan", "describe-snapshot"):
        assert tool(command, "--dir", str(node)).returncode == 0
    # nothing was changed by reading
    assert sorted((p.name, p.stat().st_size) for p in node.rglob("*") if p.is_file()) == before

    # a byte flipped in the middle of the first segment: damage, named
    segment = sorted((node / "archive").glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    damaged = tool("verify", "--dir", str(node))
    assert damaged.returncode == 1
    assert segment.name in damaged.stdout
    assert "DAMAGED" in damaged.stdout
