"""A member's disk and identity with real ``python -m cluster.node`` processes (issue 31).

* A member restarted on an empty data directory (a replaced disk) used to vote a stale
  member in, and every write acknowledged meanwhile was lost; now it votes for nobody
  until a leader elected by others has caught it up.
* Two processes on one ``--dir``, or a directory of another member, exit 2 naming it.
* The member replacement of docs/data-directory.md: a failed member's host replaced,
  same member id, a new disk, under a writer, nothing acknowledged lost.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from test_failover import (
    Load,
    kv_session,
    local_cluster,
    report,
    restart,
    running,
    unreadable,
    wait_for,
)

from cluster.local import LocalCluster, members_string

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"


def describe(cluster: LocalCluster) -> dict[int, dict]:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "describe", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return {m["member_id"]: m for m in json.loads(done.stdout)["members"]}


def node_log(cluster: LocalCluster, member_id: int) -> str:
    return (cluster.log_dir / f"node-{member_id}.log").read_text(errors="replace")


def test_a_replaced_disk_never_votes_a_stale_member_in(tmp_path: Path) -> None:
    """The issue's scenario, step by step: follower A stopped; 50 puts acknowledged by
    the leader and follower B; the leader and B killed; B's directory deleted; A and B
    started: no leader (before: B voted for A, which led and lost the 50).  The old
    leader started: it leads, all 50 read back, and B votes again once caught up."""

    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(150):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                leader = c.leader_member_id
                a, b = (i for i in range(3) if i != leader)
                cluster.kill(a)
                acknowledged = {f"key-{i}": f"value-{i}".encode() for i in range(50)}
                for key, value in acknowledged.items():
                    await kv.put(key, value)
            cluster.kill(leader)
            cluster.kill(b)
            shutil.rmtree(cluster.directory / f"node-{b}")
            await restart(cluster, a)
            await restart(cluster, b)
            # past the start-up canvass (5 s) and many election timeouts
            await trio.sleep(8)
            roles = {m: s["role"] for m, s in describe(cluster).items() if s.get("role")}
            assert "LEADER" not in roles.values(), roles
            assert "catch-up member" in node_log(cluster, b)
            assert describe(cluster)[b]["catching_up"] is True
            await restart(cluster, leader)
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                assert await unreadable(kv, acknowledged) == []
            await wait_for(
                lambda: describe(cluster)[b].get("catching_up") is False,
                30,
                f"member {b} to vote again",
                interval=0.5,
            )
            assert "is a voting member again" in node_log(cluster, b)
            report("replaced disk", lost=0, acknowledged=len(acknowledged))

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)


def node_command(directory: Path, member_id: int, members: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cluster.node",
        "--member-id",
        str(member_id),
        "--members",
        members,
        "--dir",
        str(directory),
        "--service",
        KV,
    ]


def test_a_second_process_on_a_live_directory_exits_2_naming_the_holder(tmp_path: Path) -> None:
    members = members_string(1)
    directory = tmp_path / "node"
    first = subprocess.Popen(
        node_command(directory, 0, members), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # the first one is up once it listens (its identity alone is not enough: a first
        # node that then lost its port to another test's process, three run at once,
        # exited and freed the directory for the second)
        _until(lambda: _listening(members), "the first node on its ingress port")
        assert first.poll() is None, "the first node exited"
        second = subprocess.run(
            node_command(directory, 0, members_string(1)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2, second.stderr
        assert f"data directory {directory} is in use by another process" in second.stderr
        assert f"(pid {first.pid})" in second.stderr
        assert first.poll() is None  # the first one goes on
    finally:
        first.terminate()
        first.wait(30)
    # and once it has stopped, the directory is free again (the lock died with it)
    again = subprocess.Popen(
        node_command(directory, 0, members), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _until(lambda: _listening(members), "the node on its ingress port")
        assert again.poll() is None
    finally:
        again.terminate()
        again.wait(30)


def _until(condition: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    """Poll ``condition`` (another process's files or ports) for up to ``limit`` s."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit}s waiting for {what}")
        time.sleep(0.05)


def _listening(members: str) -> bool:
    host, ingress = members.partition("=")[2].split(":")[:2]
    try:
        socket.create_connection((host, int(ingress)), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_a_directory_of_another_member_or_cluster_exits_2(tmp_path: Path) -> None:
    members = members_string(2)
    directory = tmp_path / "node"
    first = subprocess.Popen(
        node_command(directory, 0, members), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _until(lambda: (directory / "member.json").exists(), "the first node's identity")
    finally:
        first.terminate()
        first.wait(30)
    other = subprocess.run(
        node_command(directory, 1, members), capture_output=True, text=True, timeout=60
    )
    assert other.returncode == 2
    assert f"data directory {directory} belongs to member 0, not member 1" in other.stderr
    cluster = subprocess.run(
        [*node_command(directory, 0, members), "--cluster-id", "7"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cluster.returncode == 2
    assert f"data directory {directory} belongs to cluster 0, not cluster 7" in cluster.stderr


def test_replacing_a_failed_member_under_a_writer_loses_nothing(tmp_path: Path) -> None:
    """docs/data-directory.md's procedure: the member's host fails (SIGKILL), a new one
    takes its place with the same member id and address and an empty disk; it starts with
    the same command line, catches up, votes again, and the cluster never stops taking
    writes."""

    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(150):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "replace")
                async with running(load):
                    await load.wait_acks_sent_after(0.0, 200, 30)
                    failed = next(i for i in range(3) if i != c.leader_member_id)
                    cluster.kill(failed)
                    shutil.rmtree(cluster.directory / f"node-{failed}")  # the new disk
                    await load.wait_acks_sent_after(trio.current_time(), 200, 30)
                    await restart(cluster, failed)
                    await wait_for(
                        lambda: "is a voting member again" in node_log(cluster, failed),
                        30,
                        f"member {failed} to be caught up",
                        interval=0.2,
                    )
                    # it counts again: the cluster goes on without the other follower
                    other = next(i for i in range(3) if i not in (failed, c.leader_member_id))
                    cluster.kill(other)
                    await load.wait_acks_sent_after(trio.current_time(), 200, 30)
                assert await unreadable(kv, load.acked) == []
                report("member replaced", acked=len(load.acked))

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)


def test_replacing_a_failed_member_on_a_new_address(tmp_path: Path) -> None:
    """docs/data-directory.md's procedure for a new address: the failed member's entry
    changes in --members; the others restart one at a time with the new list (a leader
    hands over as it stops), then the new member starts with it on an empty disk, catches
    up and votes; the writer's acknowledged writes all read back."""

    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(240):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "moved")
                async with running(load):
                    await load.wait_acks_sent_after(0.0, 200, 30)
                    failed = next(i for i in range(3) if i != c.leader_member_id)
                    cluster.kill(failed)
                    shutil.rmtree(cluster.directory / f"node-{failed}")
                    moved = members_string(1).partition("=")[2]  # new free ports
                    entries = cluster.members.split(",")
                    entries[failed] = f"{failed}={moved}"
                    cluster.members = ",".join(entries)
                    survivors = [i for i in range(3) if i != failed]
                    leader = c.leader_member_id
                    for member in sorted(survivors, key=lambda m: m == leader):  # leader last
                        cluster.stop(member)  # SIGTERM: a leader hands over first
                        await restart(cluster, member)
                        await load.wait_acks_sent_after(trio.current_time(), 50, 60)
                    await restart(cluster, failed)
                    await wait_for(
                        lambda: "is a voting member again" in node_log(cluster, failed),
                        60,
                        f"member {failed} to be caught up on its new address",
                        interval=0.2,
                    )
                    await load.wait_acks_sent_after(trio.current_time(), 200, 60)
                assert await unreadable(kv, load.acked) == []
                report("member replaced on a new address", acked=len(load.acked))

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)
