"""Backup and restore (issue 34), with real processes: a stopped member's directory is
backed up, a new cluster's three members are restored from the backup and start with the
same command line as any other, with every acknowledged write, the timers and the
sessions' state; a restore to a point in time (a position, or a time) holds exactly the
writes before it.  Copies of a real backup, damaged (issue 41), fail ``verify`` naming
the file and ``restore`` writes nothing; ``cluster-backup`` will not extend a one-shot
backup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from functools import partial
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


def times_in_log(archive: Path) -> dict[int, int]:
    """Each record's end and its cluster time (epoch ms)."""
    return {position + 8 + len(body): LOG.decode(body).timestamp
            for position, body in read_log(archive)}  # fmt: skip


def damaged_copies(backup: Path, into: Path) -> dict[str, tuple[Path, str]]:
    """Copies of ``backup`` damaged as in issue 41, each with what verify must say (the
    damaged file's name, or what is missing)."""
    copies: dict[str, tuple[Path, str]] = {}

    def copy(name: str) -> tuple[Path, Path]:
        target = into / name
        shutil.copytree(backup, target)
        return target, sorted((target / "archive").glob("*.seg"))[-1]

    target, segment = copy("segment-deleted")
    segment.unlink()
    copies["segment-deleted"] = (target, "archive: holds no log segment")
    for name, cut in (("cut-in-half", None), ("last-10-bytes-cut", 10)):
        target, segment = copy(name)
        size = segment.stat().st_size
        os.truncate(segment, size // 2 if cut is None else size - cut)
        copies[name] = (target, segment.name)
    for name, span in (("last-crc-broken", 1), ("tail-zeroed", 1000)):
        target, segment = copy(name)
        data = bytearray(segment.read_bytes())
        data[-span:] = bytes(span) if span > 1 else bytes([data[-1] ^ 0xFF])
        segment.write_bytes(bytes(data))
        copies[name] = (target, segment.name)
    target, _segment = copy("covers-raised")
    manifest = json.loads((target / "backup.json").read_text())
    manifest["covers"] += 1000
    (target / "backup.json").write_text(json.dumps(manifest))
    copies["covers-raised"] = (target, "backup.json")
    target, segment = copy("segment-linked")
    segment.rename(into / "elsewhere.seg")
    segment.symlink_to(into / "elsewhere.seg")
    copies["segment-linked"] = (target, segment.name)
    target, _segment = copy("snapshot-linked-to-dev-zero")
    snapshot = sorted((target / "snapshots").glob("*.snap"))[-1]
    snapshot.unlink()
    snapshot.symlink_to("/dev/zero")
    copies["snapshot-linked-to-dev-zero"] = (target, snapshot.name)
    return copies


def test_a_restore_to_a_point_in_time_holds_the_writes_before_it(tmp_path: Path) -> None:
    live = tmp_path / "live"

    async def write(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            await kv.put("before", b"1")
            assert tool("--members", cluster.members, "snapshot").returncode == 0
            for i in range(50):
                await kv.put(f"p{i}", b"x")
                await trio.sleep(0.002)  # the puts a few milliseconds apart in cluster time
            made = await trio.to_thread.run_sync(
                tool, "--members", cluster.members, "backup", "--out", str(live)
            )
            assert made.returncode == 0, made.stderr
            # cluster-backup does not go on with a one-shot backup: it says so, exit 2
            held = sorted((p.name, p.stat().st_size) for p in live.rglob("*"))
            extended = await trio.to_thread.run_sync(partial(
                subprocess.run, [sys.executable, "-m", "cluster.backup", "--members",
                                 cluster.members, "--out", str(live)],
                capture_output=True, text=True, timeout=60, check=False,
            ))  # fmt: skip
            assert extended.returncode == 2, extended.stderr
            assert "is a one-shot backup" in extended.stderr
            assert "new --out" in extended.stderr
            assert sorted((p.name, p.stat().st_size) for p in live.rglob("*")) == held

    with local_cluster(1, tmp_path / "source") as cluster:
        trio.run(write, cluster)

    # damaged copies of the live backup: verify exit 1 naming the file, restore writes nothing
    for name, (damaged, says) in damaged_copies(live, tmp_path / "damaged").items():
        checked = tool("verify", "--dir", str(damaged))
        assert checked.returncode == 1, (name, checked.stdout)
        lines = [line for line in checked.stdout.splitlines() if "DAMAGED" in line]
        assert any(says in line for line in lines), (name, checked.stdout)
        into = tmp_path / "refused" / name
        refused = tool("restore", "--from", str(damaged), "--dir", str(into), "--member-id", "0")
        assert refused.returncode == 1, (name, refused.stdout)
        assert "nothing restored" in refused.stderr, (name, refused.stderr)
        assert not into.exists(), name

    backup = tmp_path / "backup"
    node = tmp_path / "source" / "node-0"
    assert tool("backup", "--from-dir", str(node), "--out", str(backup)).returncode == 0
    manifest = json.loads((backup / "backup.json").read_text())
    puts = puts_in_log(backup / "archive", manifest["snapshot"]["log_position"], 1 << 62)
    assert [key for _, key in puts] == [f"p{i}" for i in range(50)]
    times = times_in_log(backup / "archive")
    # just after p19, or the first put after it that the next one follows by a millisecond
    at = next(i for i in range(19, 49) if times[puts[i + 1][0]] > times[puts[i][0]])
    cut = puts[at][0]
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
        "restore", "--from", str(backup), "--dir", str(tmp_path / "position" / "node-0"),
        "--member-id", "0", "--to-position", str(cut), "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["log_end"] == cut
    # the same point by its time (the operator knows a time, not a position)
    moment = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=times[cut])).isoformat()
    timed = tool(
        "restore", "--from", str(backup), "--dir", str(tmp_path / "pit" / "node-0"),
        "--member-id", "0", "--to-time", moment, "--json",
    )  # fmt: skip
    assert timed.returncode == 0, timed.stderr
    assert json.loads(timed.stdout)["log_end"] == cut

    async def check(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await kv.get("before") == b"1"
            held = [i for i in range(50) if await kv.get(f"p{i}") is not None]
            assert held == list(range(at + 1))

    with local_cluster(1, tmp_path / "pit") as cluster:
        trio.run(check, cluster)
