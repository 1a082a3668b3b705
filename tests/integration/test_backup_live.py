"""``cluster-tool backup --out`` from a live cluster (issue 34), with real processes: the
leader's (or a member's) latest snapshot and committed log pulled over the admin port,
every record checked, in the format ``restore`` reads unchanged; a new cluster restored
from it holds every write acknowledged before the call.  The admin commands behind it
(``backup-query``, ``backup-read``) are refused like control commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from test_failover import kv_session, local_cluster
from test_tool_offline import tool

from cluster.config import parse_members
from cluster.local import LocalCluster
from cluster.tool.client import request

pytestmark = pytest.mark.slow


def restore_all(backup: Path, into: Path, members: int = 3) -> None:
    for member in range(members):
        made = tool(
            "restore", "--from", str(backup), "--dir", str(into / f"node-{member}"),
            "--member-id", str(member),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr


def test_a_live_backup_restores_every_acknowledged_write(tmp_path: Path) -> None:
    written: dict[str, bytes] = {}
    manifests: list[dict[str, object]] = []

    async def write(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for i in range(100):
                written[f"k{i}"] = f"value-{i}".encode()
                await kv.put(f"k{i}", written[f"k{i}"])
            assert tool("--members", cluster.members, "snapshot").returncode == 0
            for i in range(100):
                written[f"after-{i}"] = f"later-{i}".encode()
                await kv.put(f"after-{i}", written[f"after-{i}"])
            for out, extra in (("leader", ()), ("member", ("--member", "1"))):
                args = ("--members", cluster.members, "backup", "--out", str(tmp_path / out))
                done = await trio.to_thread.run_sync(tool, *args, *extra, "--json")
                assert done.returncode == 0, done.stderr
                manifests.append(json.loads(done.stdout))
            # a backup into a directory that holds something is refused
            again = await trio.to_thread.run_sync(
                tool, "--members", cluster.members, "backup", "--out", str(tmp_path / "leader")
            )
            assert again.returncode == 1
            assert "not empty" in again.stderr
            # the commands behind it need a loopback peer or an admin principal: from
            # here they are allowed, and a read past the commit position is refused
            member = parse_members(cluster.members)[0]
            query = await request(member, "backup-query", {}, 5)
            assert query.ok
            body = json.loads(query.body)
            past = await request(member, "backup-read", {
                "kind": "log", "from": str(body["log_start"]),
                "stop": str(body["commit_position"] + (1 << 20)),
            }, 5)  # fmt: skip
            assert not past.ok
            assert "past this member's committed log" in past.message

    with local_cluster(3, tmp_path / "source") as cluster:
        trio.run(write, cluster)

    for manifest, name in zip(manifests, ("leader", "member"), strict=True):
        assert manifest["snapshot"] is not None
        assert manifest["covers"] >= manifest["snapshot"]["log_position"]
        assert tool("verify", "--dir", str(tmp_path / name)).returncode == 0
    assert manifests[1]["member_id"] == 1

    restored = tmp_path / "restored"
    restore_all(tmp_path / "leader", restored)

    async def read_back(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for key, value in written.items():
                assert await kv.get(key) == value, key

    with local_cluster(3, restored) as cluster:
        trio.run(read_back, cluster)


def test_a_live_backup_with_no_member_reachable_exits_1_in_words(tmp_path: Path) -> None:
    members = "0=127.0.0.1:1:2:9"
    done = tool("--members", members, "backup", "--out", str(tmp_path / "b"))
    assert done.returncode == 1
    assert "no leader found" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "b").exists()
