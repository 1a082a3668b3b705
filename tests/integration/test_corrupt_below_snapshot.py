"""A corrupt record below the snapshot no longer strands a rebuilt follower (issue 33,
point 7), with real ``python -m cluster.node`` processes.

Three members, nothing compacted (``--archive-retention 0``): KV puts, a snapshot, more
puts.  A follower's data directory is wiped; a record in the leader's first segment,
well below the snapshot, is corrupted on disk; the follower is restarted from nothing.
The leader cannot ship that record (it never does), so it sends the follower its snapshot
instead: the follower installs it and catches up above the bad record, and the leader
says so (a WARNING) and counts it (``snapshot_fallbacks``).  And a follower rebuilt on a
disk too small for the snapshot refuses it, the leader says so in ``errors``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
from test_compaction import (
    KV,
    members,
    node_dir,
    put_batch,
    report,
    segments,
    snapshot_files,
    tool_json,
    wait_for,
)
from test_full_disk import fill, small_disk

import client
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

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
    "0",
]

COMPACTING_ARGS = [*NODE_ARGS[:-1], "2"]


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_rebuilt_follower_catches_up_above_a_corrupt_record_by_snapshot(
    tmp_path: Path,
) -> None:
    async def main(cluster: LocalCluster) -> None:
        acked: dict[str, bytes] = {}
        async with (
            client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
            KeyValueClient(c) as kv,
        ):
            await put_batch(kv, "before", acked)
            response = await c.request_snapshot(timeout=20)
            assert response.response_code.name == "OK", response
            leader = c.leader_member_id
            await wait_for(lambda: snapshot_files(cluster, leader), 20, "the snapshot")
            await put_batch(kv, "after", acked)
            follower = next(i for i in range(3) if i != leader)
            cluster.kill(follower)
            shutil.rmtree(node_dir(cluster, follower))
            first = segments(cluster, leader)[0]
            assert first.stem.endswith("0" * 20)
            flip_byte(first, 30_000)  # a record body in the middle of it
            cluster.start(follower)
            await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[follower]))

            def caught_up() -> bool:
                status = members(cluster)
                return (
                    status[follower]["commit_position"] >= status[leader]["commit_position"] > 0
                    and status[follower]["role"] == "FOLLOWER"
                )

            await wait_for(caught_up, 60, "the rebuilt follower to catch up")
            status = await trio.to_thread.run_sync(members, cluster)
            assert status[leader]["counters"]["snapshot_fallbacks"] == 1, status[leader]
            leader_log = (cluster.log_dir / f"node-{leader}.log").read_text()
            assert f"member {follower} needs the corrupt record at" in leader_log
            follower_log = (cluster.log_dir / f"node-{follower}.log").read_text()
            assert "installed snapshot at log position" in follower_log
            await put_batch(kv, "rebuilt", acked)
            # the rebuilt follower holds what was acknowledged: the other one is stopped
            other = next(i for i in range(3) if i not in (leader, follower))
            cluster.kill(other)
            await kv.put("two-of-three", b"1")
            for key in list(acked)[::50]:
                assert await kv.get(key) == acked[key]
            report(fallbacks=1, follower_commit=status[follower]["commit_position"])

    cluster = LocalCluster(3, KV, tmp_path, extra_args=NODE_ARGS)
    try:
        cluster.start_all(timeout=20)
        trio.run(main, cluster)
    finally:
        cluster.stop_all()


def test_a_follower_without_room_refuses_the_snapshot_and_the_leader_says_so(
    tmp_path: Path,
) -> None:
    """A follower rebuilt on a disk too small for the leader's snapshot refuses it (no
    file written); the leader's ERROR is in ``cluster-tool errors``; once space is freed
    the follower takes the snapshot at the next ask and catches up."""

    async def main(cluster: LocalCluster) -> None:
        acked: dict[str, bytes] = {}
        async with (
            client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
            KeyValueClient(c) as kv,
        ):
            for k in range(3):  # the log start moves past 0: a wiped member needs a snapshot
                await put_batch(kv, f"b{k}", acked)
                response = await c.request_snapshot(timeout=20)
                assert response.response_code.name == "OK", response
            leader = c.leader_member_id
            await wait_for(lambda: len(snapshot_files(cluster, leader)) == 2, 20, "compaction")
            snapshot_size = snapshot_files(cluster, leader)[-1].stat().st_size
            follower = next(i for i in range(3) if i != leader)
            cluster.kill(follower)
            directory = node_dir(cluster, follower)
            shutil.rmtree(directory)
            with small_disk(directory, "16m"):
                filler = fill(directory, snapshot_size + (256 << 10))  # < size + reserve
                cluster.start(follower)
                await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[follower]))

                def refused() -> bool:
                    errors = tool_json(cluster, "errors", "--member", str(leader))
                    return any(
                        f"member {follower} refused snapshot" in e["message"]
                        for e in errors["members"][0]["errors"]
                    )

                await wait_for(refused, 30, "the leader to say the follower refused")
                assert not list((directory / "snapshots").glob("install-*.tmp"))
                follower_log = (cluster.log_dir / f"node-{follower}.log").read_text()
                assert "kept in reserve" in follower_log
                filler.unlink()

                def caught_up() -> bool:
                    status = members(cluster)
                    return (
                        status[follower]["commit_position"] >= status[leader]["commit_position"] > 0
                    )

                await wait_for(caught_up, 60, "the follower to catch up once it has room")
                report(snapshot_bytes=snapshot_size, refused_then_installed=True)
                cluster.kill(follower)  # before the tmpfs goes

    cluster = LocalCluster(3, KV, tmp_path, extra_args=COMPACTING_ARGS)
    try:
        cluster.start_all(timeout=20)
        trio.run(main, cluster)
    finally:
        cluster.stop_all()
