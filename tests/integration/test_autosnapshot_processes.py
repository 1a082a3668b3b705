"""Snapshots that take themselves, with real ``python -m cluster.node`` processes.

Three members with ``--snapshot-log-bytes 256KiB``, 64 KiB segments and
``--archive-retention 2``, and a KV writer overwriting 400 keys round after round (the
state stops growing, the log does not).  Nobody asks for a snapshot, yet every member
takes one every 256 KiB of log or so, all at the same log positions; compaction keeps
each archive bounded; ``describe`` shows the last snapshot on every member; a follower
restarted replays only the log after its last snapshot and then takes the next ones
with the others; a leader that hands over in the middle of the writes leaves no second
request behind (the snapshots stay a threshold apart); every acknowledged write reads
back.  ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import trio
from test_compaction import archive_size, members, recording_log, wait_for

import client
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"
THRESHOLD = 256 << 10
SEGMENT = 64 << 10
SLACK = 128 << 10
"""Log a snapshot may come after its threshold: what was written in the slow tick (10 ms)
before the check, and while the previous snapshot was being written."""
NODE_ARGS = [
    "--leader-heartbeat-timeout",
    "2s",
    "--election-timeout",
    "500ms",
    "--session-timeout",
    "20s",
    "--segment-size",
    "64KiB",
    "--archive-retention",
    "2",
    "--snapshot-log-bytes",
    "256KiB",
]
KEYS = 400
VALUE = 300
ROUNDS = 24
REPLAYED = re.compile(r"replayed (\d+) bytes of log \((\d+)\.\.(\d+) of (\d+)")


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


async def write_round(kv: KeyValueClient, r: int, acked: dict[str, bytes]) -> None:
    """Every key once (so the last acknowledged value of each is the one it must hold)."""
    limiter = trio.CapacityLimiter(32)

    async def put(i: int) -> None:
        async with limiter:
            key = f"key-{i}"
            value = (f"{key}:{r}:" * 40).encode()[:VALUE]
            await kv.put(key, value)
            acked[key] = value

    async with trio.open_nursery() as nursery:
        for i in range(KEYS):
            nursery.start_soon(put, i)


def snapshot_positions(cluster: LocalCluster, member_id: int) -> list[int]:
    """The log positions of the member's recorded snapshots (the consensus module's)."""
    return sorted(
        e["log_position"]
        for e in recording_log(cluster, member_id)
        if e["type"] == "SNAPSHOT" and e["service_id"] == -1 and e["valid"]
    )


def report(**figures: Any) -> None:
    print("\n[autosnapshot] " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def test_snapshots_take_themselves_on_every_member_and_bound_the_log(tmp_path: Path) -> None:
    async def settled(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
        """Every member has applied the same log and recorded the same last snapshot."""
        status: dict[int, dict[str, Any]] = {}

        def same() -> bool:
            status.clear()
            status.update(members(cluster))
            commits = {m["applied_position"] for m in status.values()}
            lasts = {m["last_snapshot_position"] for m in status.values()}
            return len(status) == 3 and len(commits) == 1 and len(lasts) == 1

        await wait_for(same, 30, "every member at the same position and snapshot")
        return status

    async def main(cluster: LocalCluster) -> None:
        acked: dict[str, bytes] = {}
        async with (
            client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
            KeyValueClient(c) as kv,
        ):
            for r in range(ROUNDS):
                await write_round(kv, r, acked)
            leader = c.leader_member_id
            status = await settled(cluster)
            logged = status[leader]["commit_position"]
            positions = {
                i: await trio.to_thread.run_sync(snapshot_positions, cluster, i) for i in range(3)
            }
            sizes = [archive_size(cluster, i) for i in range(3)]
            gaps = [b - a for a, b in zip(positions[leader], positions[leader][1:], strict=False)]
            report(
                log_bytes=logged,
                snapshots=len(positions[leader]),
                snapshot_positions=positions[leader],
                archive_bytes=sizes,
                auto_snapshots=status[leader]["auto_snapshots"],
            )
            # nobody asked, yet every member snapshotted at the same positions
            assert positions[0] == positions[1] == positions[2]
            assert len(positions[leader]) >= logged // (THRESHOLD + SLACK) - 1 >= 6
            assert status[leader]["auto_snapshots"] == len(positions[leader])
            assert all(THRESHOLD <= gap <= THRESHOLD + SLACK for gap in gaps), gaps
            assert positions[leader][0] <= THRESHOLD + SLACK
            # describe says so on every member
            for m in status.values():
                assert m["last_snapshot_position"] == positions[leader][-1]
                assert m["log_bytes_since_snapshot"] < THRESHOLD + SLACK
                assert m["snapshot_log_bytes"] == THRESHOLD
                assert 0 <= m["last_snapshot_age_s"] < 120
            # compaction kept each archive to the log of two snapshots and a segment
            bound = 2 * (THRESHOLD + SLACK) + 2 * SEGMENT
            for i in range(3):
                assert sizes[i] <= bound, (i, sizes)
                assert sizes[i] < logged / 3, (i, sizes)
                assert not (
                    cluster.directory / f"node-{i}" / "archive" / ("log-00000000000000000000.seg")
                ).exists()
            # a follower restarted replays only the log after its last snapshot
            follower = next(i for i in range(3) if i != leader)
            last = status[follower]["last_snapshot_position"]
            assert cluster.stop(follower) == 0
            cluster.start(follower)
            await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[follower]))
            log_text = (cluster.log_dir / f"node-{follower}.log").read_text()
            replayed, start, end, _ = map(int, REPLAYED.findall(log_text)[-1])
            report(restart_replayed_bytes=replayed, from_snapshot_at=start, to=end)
            assert start == last
            assert replayed < THRESHOLD + SLACK
            # it goes on taking the snapshots the others take, once it follows the
            # leader again: writes sent while it still canvasses (0.6 s on a loaded
            # machine) can take the leader past two snapshots and a compaction, and then
            # it is sent the latest snapshot instead of the one between, as it must be
            await wait_for(
                lambda: members(cluster)[follower]["leader_member_id"] == leader,
                30,
                "the restarted follower follows the leader",
            )
            for r in range(ROUNDS, ROUNDS + 6):
                await write_round(kv, r, acked)
            status = await settled(cluster)
            again = {
                i: await trio.to_thread.run_sync(snapshot_positions, cluster, i) for i in range(3)
            }
            assert again[0] == again[1] == again[2]
            assert len(again[leader]) > len(positions[leader])
            # the leader hands over (SIGTERM) in the middle of the writes: the new leader
            # counts from the last snapshot, whoever asked for it, and asks no second one
            ROUND = ROUNDS + 6

            async def hand_over() -> None:
                await trio.sleep(0.3)
                assert await trio.to_thread.run_sync(cluster.stop, leader) == 0

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hand_over)
                for r in range(ROUND, ROUND + 6):
                    await write_round(kv, r, acked)
            assert c.leader_member_id != leader
            new_leader = c.leader_member_id
            cluster.start(leader)
            await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[leader]))
            for r in range(ROUND + 6, ROUND + 9):
                await write_round(kv, r, acked)
            status = await settled(cluster)
            stayed = [i for i in range(3) if i != leader]
            final = {
                i: await trio.to_thread.run_sync(snapshot_positions, cluster, i) for i in stayed
            }
            assert final[stayed[0]] == final[stayed[1]]
            gaps = [b - a for a, b in zip(final[new_leader], final[new_leader][1:], strict=False)]
            report(after_hand_over=final[new_leader][len(again[new_leader]) :])
            assert all(THRESHOLD <= gap <= THRESHOLD + SLACK for gap in gaps), gaps
            assert status[new_leader]["auto_snapshots"] >= 1
            assert status[leader]["last_snapshot_position"] == final[new_leader][-1]
            bad: list[str] = []
            limiter = trio.CapacityLimiter(32)

            async def check(key: str, value: bytes) -> None:
                async with limiter:
                    if await kv.get(key) != value:
                        bad.append(key)

            async with trio.open_nursery() as nursery:
                for key, value in acked.items():
                    nursery.start_soon(check, key, value)
            assert bad == [], f"{len(bad)} acknowledged writes do not read back: {bad[:5]}"
            assert len(acked) == KEYS

    with local_cluster(tmp_path) as cluster:
        trio.run(main, cluster)
