"""Log compaction and catch-up by snapshot install with real ``python -m cluster.node``
processes (issue #19).

Three members with 64 KiB segments and ``--archive-retention 2``: batches of KV puts,
a snapshot after each; every member's archive shrinks and stays bounded (about two
batches and a segment) while the log grows.  Then a follower's data directory is wiped
and the follower restarted: the leader has purged the log it needs, so it is sent the
leader's latest snapshot, installs it and catches up; its log from there is byte for
byte the leader's.  Then the leader is killed, and every acknowledged write reads back.
``pytest -s`` prints the figures (notes/compaction.md has them).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import trio

import client
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"
SEGMENT = 64 << 10
NODE_ARGS = [
    "--leader-heartbeat-timeout",
    "1s",
    "--election-timeout",
    "500ms",
    "--session-timeout",
    "20s",
    "--segment-size",
    "64KiB",
    "--archive-retention",
    "2",
]
BATCH = 600
VALUE = 200
SNAPSHOTS = 6


def tool_json(cluster: LocalCluster, *args: str) -> Any:
    result = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def members(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    return {m["member_id"]: m for m in tool_json(cluster, "describe")["members"]}


def recording_log(cluster: LocalCluster, member_id: int) -> list[dict[str, Any]]:
    document = tool_json(cluster, "recording-log", "--member", str(member_id))
    return list(document["members"][0]["entries"])


def node_dir(cluster: LocalCluster, member_id: int) -> Path:
    return cluster.directory / f"node-{member_id}"


def archive_size(cluster: LocalCluster, member_id: int) -> int:
    return sum(p.stat().st_size for p in (node_dir(cluster, member_id) / "archive").glob("*.seg"))


def segments(cluster: LocalCluster, member_id: int) -> list[Path]:
    return sorted((node_dir(cluster, member_id) / "archive").glob("*.seg"))


def snapshot_files(cluster: LocalCluster, member_id: int) -> list[Path]:
    return sorted((node_dir(cluster, member_id) / "snapshots").glob("*.snap"))


def log_from(cluster: LocalCluster, member_id: int, start: int, stop: int) -> bytes:
    """The member's log bytes [start, stop) from its segment files."""
    out = bytearray()
    for path in segments(cluster, member_id):
        base = int(path.stem.split("-")[1])
        data = path.read_bytes()
        low, high = max(start, base), min(stop, base + len(data))
        if low < high:
            out += data[low - base : high - base]
    return bytes(out)


@contextmanager
def local_cluster(directory: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(3, KV, directory, extra_args=NODE_ARGS)
    try:
        cluster.start_all(timeout=20)
        yield cluster
    finally:
        for proc in cluster.processes.values():
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
        cluster.stop_all()


async def wait_for(predicate: Any, limit: float, what: str, interval: float = 0.1) -> None:
    with trio.move_on_after(limit):
        while True:
            if await trio.to_thread.run_sync(predicate):
                return
            await trio.sleep(interval)
    raise AssertionError(f"timed out after {limit}s waiting for {what}")


async def put_batch(kv: KeyValueClient, prefix: str, acked: dict[str, bytes]) -> None:
    limiter = trio.CapacityLimiter(64)

    async def put(i: int) -> None:
        async with limiter:
            key = f"{prefix}-{i}"
            value = (f"{key}:" * 40).encode()[:VALUE]
            await kv.put(key, value)
            acked[key] = value

    async with trio.open_nursery() as nursery:
        for i in range(BATCH):
            nursery.start_soon(put, i)


def report(**figures: Any) -> None:
    print("\n[compaction] " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def test_compaction_bounds_the_archive_and_a_wiped_follower_is_rebuilt_by_snapshot(
    tmp_path: Path,
) -> None:
    async def main(cluster: LocalCluster) -> None:
        acked: dict[str, bytes] = {}
        async with (
            client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
            KeyValueClient(c) as kv,
        ):
            await kv.put("warm-up", b"1")
            sizes: list[list[int]] = []
            positions: list[int] = []
            for k in range(SNAPSHOTS):
                await put_batch(kv, f"b{k}", acked)
                response = await c.request_snapshot(timeout=20)
                assert response.response_code.name == "OK", response
                await wait_for(
                    lambda k=k: all(
                        len(snapshot_files(cluster, i)) >= min(k + 1, 2) for i in range(3)
                    ),
                    20,
                    "the snapshot on every member",
                )
                status = await trio.to_thread.run_sync(members, cluster)
                positions.append(max(m["commit_position"] for m in status.values()))
                sizes.append([archive_size(cluster, i) for i in range(3)])
            leader = c.leader_member_id
            logged = positions[-1]
            batch_bytes = positions[-1] - positions[-2]
            report(
                log_bytes_written=logged,
                log_position_at_each_snapshot=positions,
                archive_bytes_per_member_after_each_snapshot=sizes,
                batch_bytes=batch_bytes,
            )
            # bounded: the log since the 2nd newest snapshot and one segment, at most
            bound = 2 * batch_bytes + 2 * SEGMENT
            for i in range(3):
                assert sizes[-1][i] <= bound, (i, sizes)
                assert sizes[-1][i] < logged / 2, (i, sizes)
                # and it shrank: after the 3rd snapshot the first segments were deleted
                assert not (
                    node_dir(cluster, i) / "archive" / "log-00000000000000000000.seg"
                ).exists()
                assert len(snapshot_files(cluster, i)) == 2  # older snapshot files deleted
            entries = await trio.to_thread.run_sync(recording_log, cluster, leader)
            starts = [e for e in entries if e["type"] == "LOG_START"]
            assert starts, entries
            snapshot_size = snapshot_files(cluster, leader)[-1].stat().st_size
            # a follower's data directory is lost: it is rebuilt from the leader
            follower = next(i for i in range(3) if i != leader)
            cluster.kill(follower)
            shutil.rmtree(node_dir(cluster, follower))
            await put_batch(kv, "while-down", acked)
            began = time.monotonic()
            cluster.start(follower)
            await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[follower]))

            def caught_up() -> bool:
                status = members(cluster)
                return (
                    status[follower]["commit_position"] >= status[leader]["commit_position"] > 0
                    and status[follower]["role"] == "FOLLOWER"
                )

            await wait_for(caught_up, 60, "the wiped follower to catch up")
            rebuild = time.monotonic() - began
            entries = await trio.to_thread.run_sync(recording_log, cluster, follower)
            resets = [e for e in entries if e["type"] == "LOG_RESET"]
            assert len(resets) == 1, entries
            start = resets[0]["log_position"]
            assert start > 0
            status = await trio.to_thread.run_sync(members, cluster)
            end = min(status[follower]["commit_position"], status[leader]["commit_position"])
            assert log_from(cluster, follower, start, end) == log_from(cluster, leader, start, end)
            log_text = (cluster.log_dir / f"node-{follower}.log").read_text()
            assert "installed snapshot at log position" in log_text
            report(
                snapshot_bytes=snapshot_size,
                rebuild_seconds=round(rebuild, 2),
                installed_at=start,
                follower_archive_bytes=archive_size(cluster, follower),
            )
            await put_batch(kv, "after-rebuild", acked)
            # the leader dies: the rebuilt follower and the other one carry on
            cluster.kill(leader)
            await put_batch(kv, "after-failover", acked)
            assert c.leader_member_id != leader
            bad: list[str] = []
            limiter = trio.CapacityLimiter(64)

            async def check(key: str, value: bytes) -> None:
                async with limiter:
                    if await kv.get(key) != value:
                        bad.append(key)

            async with trio.open_nursery() as nursery:
                for key, value in acked.items():
                    nursery.start_soon(check, key, value)
            assert bad == [], f"{len(bad)} acknowledged writes do not read back: {bad[:5]}"
            report(acknowledged_writes_read_back=len(acked))

    with local_cluster(tmp_path) as cluster:
        trio.run(main, cluster)
