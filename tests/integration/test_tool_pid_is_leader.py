"""``cluster-tool pid --dir`` and ``cluster-tool is-leader --member N`` (issue 34's
conveniences, Aeron's ClusterTool ``pid`` and ``is-leader``), against real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_failover import local_cluster

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
