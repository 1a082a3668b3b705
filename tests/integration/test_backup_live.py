"""``cluster-tool backup --out`` from a live cluster (issue 34), with real processes: the
leader's (or a member's) latest snapshot and committed log pulled over the admin port,
every record checked, in the format ``restore`` reads unchanged; a new cluster restored
from it holds every write acknowledged before the call.  The admin commands behind it
(``backup-query``, ``backup-read``) are refused like control commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from test_backup_drill import metric, scrape, start_backup
from test_backup_restore import puts_in_log
from test_failover import NODE_ARGS, kv_session, local_cluster, unreadable
from test_security import secure_cluster
from test_tool_offline import tool

from cluster.backup.link import Link, client_identity
from cluster.backup.oneshot import OneShotError, live_backup
from cluster.config import parse_members
from cluster.local import LocalCluster, free_ports
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


def test_the_continuous_backup_survives_a_pause_a_leader_kill_and_a_restart(
    tmp_path: Path,
) -> None:
    """``cluster-backup`` paused (SIGSTOP) for longer than the members' admin idle
    timeout, the leader killed, the backup stopped (SIGTERM) and started again on its
    directory: it goes on each time, keeps only ``--retention`` snapshots (the log below
    the oldest dropped), and a restore from it holds every acknowledged write."""
    port = free_ports(1)[0]
    out = tmp_path / "continuous"
    log = open(tmp_path / "backup.log", "w")  # noqa: SIM115
    written: dict[str, bytes] = {}
    backups: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        backups.append(
            start_backup(
                cluster.members, out, port, log, "--retention", "2", "--segment-size", "8KiB"
            )
        )

    def position() -> float:
        code, text = scrape(port, "/metrics")
        return metric(text, "triarch_backup_position") if code == 200 else -1

    async def until_caught_up(at_least: float) -> None:
        for _ in range(200):
            if await trio.to_thread.run_sync(position) >= at_least:
                code, _text = await trio.to_thread.run_sync(scrape, port, "/health")
                if code == 200:
                    return
            await trio.sleep(0.1)
        raise AssertionError(f"the backup did not reach {at_least}: {scrape(port, '/health')}")

    async def commit_position() -> int:
        done = await trio.to_thread.run_sync(tool, "--members", cluster.members, "describe",
                                             "--json")  # fmt: skip
        return max(m["commit_position"] or 0 for m in json.loads(done.stdout)["members"])

    async def scenario() -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):

            async def put_some(prefix: str, count: int) -> None:
                for i in range(count):
                    written[f"{prefix}{i}"] = f"{prefix}-value-{i}".encode()
                    await kv.put(f"{prefix}{i}", written[f"{prefix}{i}"])

            await put_some("a", 100)
            await trio.to_thread.run_sync(start)
            await until_caught_up(await commit_position())
            # paused past the admin idle timeout (2 s here) while the cluster writes
            backups[0].send_signal(signal.SIGSTOP)
            await put_some("b", 100)
            await trio.sleep(2.5)
            backups[0].send_signal(signal.SIGCONT)
            await until_caught_up(await commit_position())
            for n in range(3):  # snapshots the backup pulls; it keeps two
                await trio.to_thread.run_sync(tool, "--members", cluster.members, "snapshot")
                await put_some(f"s{n}-", 50)
                await until_caught_up(await commit_position())
            # a restore while it runs (and writes go on): a consistent set
            restoring = trio.to_thread.run_sync(tool, "restore", "--from", str(out), "--dir",
                                                str(tmp_path / "while" / "node-0"),
                                                "--member-id", "0")  # fmt: skip
            async with trio.open_nursery() as nursery:
                nursery.start_soon(put_some, "w", 100)
                done = await restoring
            assert done.returncode == 0, done.stderr
            assert tool("verify", "--dir", str(tmp_path / "while" / "node-0")).returncode == 0
            # the leader killed: the backup goes on from the others
            leader = c.leader_member_id
            cluster.kill(leader)
            await put_some("c", 100)
            await until_caught_up(await commit_position())
            # stopped and started again: it goes on where it stopped
            backups[0].send_signal(signal.SIGTERM)
            assert await trio.to_thread.run_sync(backups[0].wait, 10) == 0
            held = json.loads((out / "backup.json").read_text())
            await put_some("d", 100)
            await trio.to_thread.run_sync(start)
            await until_caught_up(await commit_position())
            again = json.loads((out / "backup.json").read_text())
            assert again["new_cluster_id"] == held["new_cluster_id"]
            assert again["log_end"] > held["log_end"]
            assert again["log_start"] >= held["log_start"] > 0  # retention dropped the log
            assert len({(e["log_position"]) for e in again["snapshots"]}) <= 2

    args = [*NODE_ARGS, "--admin-idle-timeout", "2s"]
    try:
        with local_cluster(3, tmp_path / "source", args) as cluster:
            trio.run(scenario)
        backups[-1].send_signal(signal.SIGTERM)
        assert backups[-1].wait(10) == 0
    finally:
        for proc in backups:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        log.close()
    assert tool("verify", "--dir", str(out)).returncode == 0
    restore_all(out, tmp_path / "restored")

    async def read_back(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await unreadable(kv, written) == []

    with local_cluster(3, tmp_path / "restored") as cluster:
        trio.run(read_back, cluster)

    # a point in time between its two snapshots: the older one, and the puts up to there
    held = sorted({e["log_position"] for e in json.loads((out / "backup.json").read_text())
                   ["snapshots"]})  # fmt: skip
    assert len(held) == 2
    puts = puts_in_log(out / "archive", held[0], held[1])
    assert len(puts) > 10
    cut = puts[len(puts) // 2 - 1][0]
    before = [key for end, key in puts if end <= cut and key in written]
    after = [key for end, key in puts if end > cut and key in written]
    made = tool("restore", "--from", str(out), "--dir", str(tmp_path / "pit" / "node-0"),
                "--member-id", "0", "--to-position", str(cut), "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["snapshot"]["log_position"] == held[0]

    async def point_in_time(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await unreadable(kv, {k: written[k] for k in before}) == []
            assert [k for k in after if await kv.get(k) is not None] == []

    with local_cluster(1, tmp_path / "pit") as cluster:
        trio.run(point_in_time, cluster)


async def test_a_live_backup_under_tls_needs_an_admin_principal(tmp_path: Path) -> None:
    """With TLS the backup commands are answered to an admin principal only: the ``app``
    client's certificate is refused in words and nothing is left behind.  ``cluster-backup``
    with no certificates at all stops at once (exit 2: it could never succeed) and makes
    no folder."""
    async with secure_cluster(tmp_path) as c:
        with trio.fail_after(60):  # before, it polled for ever
            uncertified = await trio.run_process(
                [sys.executable, "-m", "cluster.backup", "--members", c.members, "--out",
                 str(tmp_path / "uncertified"), "--interval", "200ms"],
                capture_stdout=True, capture_stderr=True, check=False,
                env={k: v for k, v in os.environ.items() if k != "CLUSTER_CLIENT_CERTS_DIR"},
            )  # fmt: skip
        stderr = uncertified.stderr.decode()
        assert uncertified.returncode == 2, stderr
        assert "require TLS: pass --certs-dir" in stderr
        assert "client-admin" in stderr
        assert "Traceback" not in stderr
        assert not (tmp_path / "uncertified").exists()
        members = parse_members(c.members)
        admin = client_identity(str(c.client_dir("admin")), "test")
        manifest = await live_backup(members, tmp_path / "ok", member=0, tls=admin)
        assert manifest["covers"] > 0
        assert manifest["cluster_id"] == c.nodes[0].identity.cluster_id
        app = client_identity(str(c.client_dir("app")), "test")
        with pytest.raises(OneShotError, match="refused: only allowed to an admin principal"):
            await live_backup(members, tmp_path / "refused", member=1, tls=app)
        assert not (tmp_path / "refused").exists()
        # a snapshot file that is not there (compacted meanwhile): a refusal in words
        link = Link(members[0], admin)
        reply = await link.request("backup-read", {
            "kind": "snapshot", "position": "12345", "term": "0", "offset": "0",
        })  # fmt: skip
        await link.aclose()
        assert not reply.ok
        assert "is gone from this member" in reply.message


def test_backups_while_members_compact_their_log_all_the_time(tmp_path: Path) -> None:
    """Members on 16 KiB segments taking a snapshot every 32 KiB of log and keeping one:
    their snapshots and segments go away all the time under the backups' reads.  One-shot
    backups (from a follower and from the leader) succeed or fail in words, never with
    a traceback; the continuous backup follows (SIGKILLed and started again meanwhile),
    and restores every write."""
    port = free_ports(1)[0]
    out = tmp_path / "continuous"
    log = open(tmp_path / "backup.log", "w")  # noqa: SIM115
    written: dict[str, bytes] = {}
    backups: list[subprocess.Popen[bytes]] = []
    results: list[subprocess.CompletedProcess[str]] = []
    args = [*NODE_ARGS, "--segment-size", "16KiB", "--snapshot-log-bytes", "32KiB",
            "--archive-retention", "1"]  # fmt: skip

    async def scenario() -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            backups.append(start_backup(cluster.members, out, port, log, "--segment-size", "16KiB"))
            stop = trio.Event()

            async def write() -> None:
                i = 0
                while not stop.is_set():
                    written[f"k{i}"] = f"value-{i}".encode() * 4
                    await kv.put(f"k{i}", written[f"k{i}"])
                    i += 1

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(write)
                for n, member in enumerate(("1", "0", "2")):
                    target = str(tmp_path / f"oneshot-{n}")
                    results.append(await trio.to_thread.run_sync(
                        tool, "--members", cluster.members, "backup", "--out", target,
                        "--member", member,
                    ))  # fmt: skip
                # killed (SIGKILL) under the writes, perhaps half-way through a pull, and
                # started again on its directory: it goes on from its manifest
                backups[0].kill()
                await trio.to_thread.run_sync(backups[0].wait)
                backups.append(start_backup(cluster.members, out, port, log, "--segment-size",
                                            "16KiB"))  # fmt: skip
                await trio.sleep(1.5)
                stop.set()
            commit = 0
            for _ in range(100):
                done = await trio.to_thread.run_sync(tool, "--members", cluster.members,
                                                     "describe", "--json")  # fmt: skip
                commit = max(m["commit_position"] or 0 for m in json.loads(done.stdout)["members"])
                code, text = await trio.to_thread.run_sync(scrape, port, "/metrics")
                if code == 200 and metric(text, "triarch_backup_position") >= commit:
                    break
                await trio.sleep(0.2)
            assert metric(text, "triarch_backup_position") >= commit

    try:
        with local_cluster(3, tmp_path / "source", args) as cluster:
            trio.run(scenario)
        backups[-1].send_signal(signal.SIGTERM)
        assert backups[-1].wait(10) == 0
    finally:
        for proc in backups:
            if proc.poll() is None:
                proc.kill()
        log.close()
    for n, result in enumerate(results):
        assert "Traceback" not in result.stderr, result.stderr
        if result.returncode == 0:
            assert tool("verify", "--dir", str(tmp_path / f"oneshot-{n}")).returncode == 0
        else:
            assert result.returncode == 1, result.stderr
            assert "error:" in result.stderr
    assert sum(r.returncode == 0 for r in results) >= 2, [r.stderr for r in results]
    manifest = json.loads((out / "backup.json").read_text())
    assert manifest["log_start"] > 0  # the log below its snapshots dropped
    restore_all(out, tmp_path / "restored")

    async def read_back(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await unreadable(kv, written) == []

    with local_cluster(3, tmp_path / "restored") as cluster:
        trio.run(read_back, cluster)


def test_a_live_backup_passes_over_a_damaged_snapshot(tmp_path: Path) -> None:
    """The member's newest snapshot file has a flipped bit: the backup takes the one
    before it and the log from there, and a restore from it holds every write."""
    written: dict[str, bytes] = {}
    positions: list[int] = []

    async def scenario(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for n in range(2):
                for i in range(50):
                    written[f"{n}-{i}"] = f"value-{n}-{i}".encode()
                    await kv.put(f"{n}-{i}", written[f"{n}-{i}"])
                done = await trio.to_thread.run_sync(
                    tool, "--members", cluster.members, "snapshot", "--json"
                )
                assert done.returncode == 0, done.stderr
            snaps = sorted((tmp_path / "source" / "node-0" / "snapshots").glob("*.snap"))
            assert len(snaps) == 2
            data = bytearray(snaps[-1].read_bytes())
            data[len(data) // 2] ^= 0x10
            snaps[-1].write_bytes(bytes(data))
            positions.extend(int(p.name.split("-")[1]) for p in snaps)
            for i in range(20):
                written[f"after-{i}"] = b"after"
                await kv.put(f"after-{i}", b"after")
            done = await trio.to_thread.run_sync(
                tool, "--members", cluster.members, "backup", "--out", str(tmp_path / "b"),
                "--json",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            manifest = json.loads(done.stdout)
            assert manifest["snapshot"]["log_position"] == positions[0]

    with local_cluster(1, tmp_path / "source") as cluster:
        trio.run(scenario, cluster)
    assert tool("verify", "--dir", str(tmp_path / "b")).returncode == 0
    restore_all(tmp_path / "b", tmp_path / "restored", members=1)

    async def read_back(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await unreadable(kv, written) == []

    with local_cluster(1, tmp_path / "restored") as cluster:
        trio.run(read_back, cluster)
