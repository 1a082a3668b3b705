"""A SHUTDOWN or ABORT in the log acts once, on the cluster it was given to (issue 41),
with real ``python -m cluster.node`` processes and ``cluster-tool``.

An admin action in the log acts on the cluster as it was when the action was taken, and
never again: a member that meets an old SHUTDOWN later (it was down while the cluster
stopped, or its disk was replaced and it catches up over the whole log) takes the
snapshot the entry calls for and goes on; a whole cluster restarted after an ABORT
elects a leader and takes writes, every member ACTIVE.  Before the fix the first two
stopped with exit code 0 (no supervisor restarts that) and the third sat in QUITTING.

Slow-marked: skip locally with ``-m "not slow"``.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from test_cluster_tool import (
    describe,
    kv_session,
    local_cluster,
    node_log,
    tool,
    wait_settled,
    wait_until,
)

from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

SETTLE = 45.0  # seconds: start-up elections on a busy 2-core machine


async def put_all(cluster: LocalCluster, keys: range) -> None:
    async with kv_session(cluster.ingress_endpoints) as kv:
        for i in keys:
            await kv.put(f"key-{i}", f"value-{i}".encode())


async def get_all(cluster: LocalCluster, keys: range) -> list[bytes | None]:
    async with kv_session(cluster.ingress_endpoints) as kv:
        return [await kv.get(f"key-{i}") for i in keys]


def values(keys: range) -> list[bytes | None]:
    return [f"value-{i}".encode() for i in keys]


def follower_of(document: dict[str, Any], but: int = -1) -> int:
    leader = document["leader_member_id"]
    return next(m for m in range(3) if m not in (leader, but))


def member(document: dict[str, Any], member_id: int) -> dict[str, Any]:
    return next(m for m in document["members"] if m["member_id"] == member_id)


def stop_cluster_with(cluster: LocalCluster, command: str) -> None:
    """``cluster-tool COMMAND`` (shutdown, abort): every running member exits 0."""
    result = tool(cluster, command)
    assert result.returncode == 0, (result.stdout, result.stderr)
    for member_id, proc in list(cluster.processes.items()):
        assert proc.wait(30) == 0, node_log(cluster, member_id)
    cluster.processes.clear()


def test_a_member_meeting_an_old_shutdown_takes_its_snapshot_and_goes_on(
    tmp_path: Path,
) -> None:
    """One member is down while the cluster shuts down and comes back after the restart;
    then another's disk is replaced: both catch up over the SHUTDOWN and keep running."""
    with local_cluster(tmp_path) as cluster:
        late = follower_of(wait_settled(cluster, limit=SETTLE))
        trio.run(put_all, cluster, range(0, 10))
        assert cluster.stop(late) == 0  # down while the others shut down
        stop_cluster_with(cluster, "shutdown")
        others = [m for m in range(3) if m != late]
        shutdown_line = "snapshot taken, stopping"
        assert all(shutdown_line in node_log(cluster, m) for m in others)

        for member_id in others:
            cluster.start(member_id)
        wait_settled(cluster, set(others), limit=SETTLE)
        trio.run(put_all, cluster, range(10, 20))

        # the late member's log ends before the SHUTDOWN: it meets it catching up
        cluster.start(late)
        document = wait_settled(cluster, limit=SETTLE)
        trio.run(put_all, cluster, range(20, 30))
        assert cluster.processes[late].poll() is None, node_log(cluster, late)
        text = node_log(cluster, late).rpartition(f"node {late} ready")[2]
        assert "SHUTDOWN at log position" in text, text
        assert "does not stop this member: it was put on the log in term" in text, text
        assert shutdown_line not in text, text

        # a replaced disk: the member catches up over the whole log, SHUTDOWN included
        wiped = follower_of(document, but=late)
        if wiped == document["leader_member_id"]:  # pragma: no cover - follower_of says no
            raise AssertionError("wiped the leader")
        assert cluster.stop(wiped) == 0
        shutil.rmtree(cluster.directory / f"node-{wiped}")
        cluster.start(wiped)
        wait_until(
            lambda: "is a voting member again" in node_log(cluster, wiped).rpartition("ready")[2],
            SETTLE,
            "the wiped member to catch up",
        )
        trio.run(put_all, cluster, range(30, 40))
        document = wait_settled(cluster, limit=SETTLE)
        assert cluster.processes[wiped].poll() is None, node_log(cluster, wiped)
        assert all(cluster.processes[m].poll() is None for m in range(3))
        assert trio.run(get_all, cluster, range(40)) == values(range(40))
        for member_id in range(3):
            assert member(document, member_id)["module_state"] == "ACTIVE"


def test_a_cluster_restarted_after_abort_elects_and_takes_writes(tmp_path: Path) -> None:
    with local_cluster(tmp_path) as cluster:
        wait_settled(cluster, limit=SETTLE)
        trio.run(put_all, cluster, range(0, 10))
        stop_cluster_with(cluster, "abort")
        for member_id in range(3):
            assert "ABORT at log position" in node_log(cluster, member_id)

        cluster.start_all(timeout=20)
        document = wait_settled(cluster, limit=SETTLE)
        trio.run(put_all, cluster, range(10, 20))
        assert trio.run(get_all, cluster, range(20)) == values(range(20))
        document = describe(cluster)
        for member_id in range(3):
            assert member(document, member_id)["module_state"] == "ACTIVE", document
        assert all(p.poll() is None for p in cluster.processes.values())
        # and the operator's actions work again: a new ABORT stops the new cluster
        stop_cluster_with(cluster, "abort")


def test_a_member_that_missed_the_abort_meets_it_after_the_restart(tmp_path: Path) -> None:
    """A follower frozen while the cluster aborts, then killed: its log ends before the
    ABORT, and it meets the entry catching up after the whole cluster restarted, in a
    new term.  The others replay it at start-up.  Nobody stops, all ACTIVE."""
    with local_cluster(tmp_path) as cluster:
        document = wait_settled(cluster, limit=SETTLE)
        trio.run(put_all, cluster, range(0, 5))
        deaf = follower_of(document)
        cluster.signal(deaf, signal.SIGSTOP)  # never reads the ABORT
        try:
            result = tool(cluster, "--timeout", "2s", "abort")
            assert result.returncode == 0, (result.stdout, result.stderr)
            for member_id in range(3):
                if member_id != deaf:
                    assert cluster.processes[member_id].wait(30) == 0
        finally:
            cluster.kill(deaf)  # SIGKILL works on a stopped process
        cluster.processes.clear()
        cluster.start_all(timeout=20)
        wait_settled(cluster, limit=SETTLE)
        trio.run(put_all, cluster, range(5, 10))
        assert trio.run(get_all, cluster, range(10)) == values(range(10))
        document = describe(cluster)
        assert {member(document, m)["module_state"] for m in range(3)} == {"ACTIVE"}
        text = node_log(cluster, deaf)
        assert "ABORT at log position" in text, text
        assert "does not stop this member" in text, text
        assert "stopping without a snapshot" not in text, text
        assert all(p.poll() is None for p in cluster.processes.values())
