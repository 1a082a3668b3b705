"""Backup and restore (issue 34), with real processes: a stopped member's directory is
backed up, a new cluster's three members are restored from the backup and start with the
same command line as any other, with every acknowledged write, the timers and the
sessions' state; a restore to a point in time holds exactly the writes before it."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import trio
from test_failover import kv_session, local_cluster
from test_tool_offline import tool

from cluster.archive.reader import read_log
from cluster.examples.kv import Put, Request
from cluster.local import LocalCluster
from cluster.protocol.codec import LOG
from cluster.protocol.ingress import SessionMessageHeader

pytestmark = pytest.mark.slow


def puts_in_log(archive: Path, start: int, stop: int) -> list[tuple[int, str]]:
    """(record end, key) of every Put applied from the log between two positions."""
    decode = msgspec.msgpack.Decoder(Request).decode
    found = []
    for position, body in read_log(archive):
        end = position + 8 + len(body)
        if not start < end <= stop:
            continue
        message = LOG.decode(body)
        if isinstance(message, SessionMessageHeader):
            request = decode(message.payload)
            if isinstance(request, Put):
                found.append((end, request.key))
    return found


def test_a_new_cluster_restored_from_a_backup_has_every_write(tmp_path: Path) -> None:
    written: dict[str, bytes] = {}

    async def write(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for i in range(200):
                written[f"k{i}"] = f"value-{i}".encode()
                await kv.put(f"k{i}", written[f"k{i}"], ttl=3600 if i < 3 else None)
            assert tool("--members", cluster.members, "snapshot").returncode == 0
            for i in range(200):
                written[f"after-{i}"] = f"later-{i}".encode()
                await kv.put(f"after-{i}", written[f"after-{i}"])

    source = tmp_path / "source"
    with local_cluster(3, source) as cluster:
        trio.run(write, cluster)
    backup = tmp_path / "backup"
    done = tool("backup", "--from-dir", str(source / "node-0"), "--out", str(backup), "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["snapshot"] is not None
    assert manifest["covers"] >= manifest["snapshot"]["log_position"]
    assert tool("verify", "--dir", str(backup)).returncode == 0
    # a second backup into the same place is refused
    assert (
        tool("backup", "--from-dir", str(source / "node-0"), "--out", str(backup)).returncode == 1
    )

    restored = tmp_path / "restored"
    for member in range(3):
        made = tool(
            "restore", "--from", str(backup), "--dir", str(restored / f"node-{member}"),
            "--member-id", str(member),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        identity = json.loads((restored / f"node-{member}" / "member.json").read_text())
        assert identity == {
            "cluster_id": manifest["new_cluster_id"],
            "member_id": member,
            "voting": True,
        }
    # into a directory that holds something: refused
    assert tool(
        "restore", "--from", str(backup), "--dir", str(restored / "node-0"), "--member-id", "0"
    ).returncode == 1  # fmt: skip

    async def read_back(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for key, value in written.items():
                assert await kv.get(key) == value, key

    with local_cluster(3, restored) as cluster:
        trio.run(read_back, cluster)

    # the same cluster: refused when the backup is short of the cluster's commit
    short = tool(
        "restore", "--from", str(backup), "--dir", str(tmp_path / "same"), "--member-id", "1",
        "--same-cluster", "--cluster-commit", str(manifest["covers"] + 1),
    )  # fmt: skip
    assert short.returncode == 1
    assert "short of the cluster's commit" in short.stderr


def test_a_restore_to_a_point_in_time_holds_the_writes_before_it(tmp_path: Path) -> None:
    async def write(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            await kv.put("before", b"1")
            assert tool("--members", cluster.members, "snapshot").returncode == 0
            for i in range(50):
                await kv.put(f"p{i}", b"x")

    with local_cluster(1, tmp_path / "source") as cluster:
        trio.run(write, cluster)
    backup = tmp_path / "backup"
    node = tmp_path / "source" / "node-0"
    assert tool("backup", "--from-dir", str(node), "--out", str(backup)).returncode == 0
    manifest = json.loads((backup / "backup.json").read_text())
    puts = puts_in_log(backup / "archive", manifest["snapshot"]["log_position"], 1 << 62)
    assert [key for _, key in puts] == [f"p{i}" for i in range(50)]
    cut = puts[19][0]  # just after p19
    assert (
        tool(
            "restore",
            "--from",
            str(backup),
            "--dir",
            str(tmp_path / "pit" / "node-0"),
            "--member-id",
            "0",
            "--to-position",
            str(cut + 1),
        ).returncode
        == 1
    )  # fmt: skip  (not where a record ends)
    made = tool(
        "restore", "--from", str(backup), "--dir", str(tmp_path / "pit" / "node-0"),
        "--member-id", "0", "--to-position", str(cut),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr

    async def check(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await kv.get("before") == b"1"
            assert [i for i in range(50) if await kv.get(f"p{i}") is not None] == list(range(20))

    with local_cluster(1, tmp_path / "pit") as cluster:
        trio.run(check, cluster)
