"""Issue 33 in the simulator, the snapshot's points: a snapshot transfer that stops
because its leader crashed is dropped by the receiving member at once (its temporary
file removed, no restart needed), and the next leader's transfer installs (point 6); a
member rebuilt from nothing, whose leader holds a corrupt record below its snapshot, is
sent the snapshot instead and catches up above the record (point 7)."""

from __future__ import annotations

import os
from pathlib import Path

from cluster.archive.reader import list_segments

from .harness import SimCluster
from .test_sim import (
    _compact_without,
    _in_the_middle_of_a_transfer,
    _installs,
    _node,
    _sim,
    _take_snapshot,
)


def test_a_transfer_whose_leader_crashed_is_removed_at_once(tmp_path: Path) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        lagger = (leader + 1) % 3
        behind = _node(sim, leader).archive.position
        await sim.wipe(lagger)
        for _ in range(4):  # until the leader no longer has the log the lagger needs
            if await _compact_without(sim, lagger) > behind:
                break
        leader = await sim.wait_for_leader()
        await sim.restart(lagger)

        await _in_the_middle_of_a_transfer(sim, lagger)
        snapshots = sim.nodes[lagger].dir / "snapshots"
        assert list(snapshots.glob("install-*.tmp")), "a transfer was under way"
        await sim.crash(leader)
        await sim.wait_for(
            "the stopped transfer's file removed, the member still running",
            lambda: not list(snapshots.glob("install-*.tmp")),
            15.0,
        )
        assert sim.nodes[lagger].running
        assert _node(sim, lagger).catchup.abandoned_installs >= 1
        await sim.restart(leader)
        await sim.wait_for(
            "the member installs a snapshot from whoever leads now",
            lambda: _installs(sim, lagger) >= 1,
            20.0,
        )
        await sim.sleep(1.0)

    _sim(13, 3, tmp_path, scenario, clients=3, latency=(0.004, 0.012), segment_size=4 << 10)


def _flip_bit(path: Path, offset: int) -> None:
    """Damage on the medium: written and synced through ``os``, so that the simulator's
    disk model (``tests/sim/disk.py``) holds it as the file's durable bytes."""
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0x40]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_rebuilt_member_catches_up_above_a_corrupt_record_by_snapshot(tmp_path: Path) -> None:
    """Nothing compacted (retention 0): writes, a snapshot, more writes; a follower loses
    its disk; a byte in the middle of the leader's first segment flips on disk; the
    follower restarts from nothing.  The leader never ships the bad record: it sends the
    snapshot instead, counts it, and the follower catches up (the liveness phase checks
    every member's log and store, the checker every committed byte the follower holds)."""
    seen: dict[str, int] = {}

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        snapshot = await _take_snapshot(sim)
        await sim.sleep(0.5)
        leader = await sim.wait_for_leader()
        follower = (leader + 1) % 3
        await sim.wipe(follower)
        first = list_segments(sim.nodes[leader].dir / "archive")[0]
        assert first.end < snapshot, "the first segment lies below the snapshot"
        _flip_bit(first.path, first.length // 2)  # a record's body, mid-segment
        await sim.restart(follower)
        await sim.wait_for(
            "the rebuilt member installs the snapshot above the corrupt record",
            lambda: _installs(sim, follower) >= 1,
            10.0,
        )
        node = _node(sim, leader)
        seen["fallbacks"] = node.cm.counters.snapshot_fallbacks
        seen["start"] = _node(sim, follower).archive.start_position
        seen["snapshot"] = snapshot
        await sim.sleep(1.0)

    _sim(14, 3, tmp_path, scenario, clients=3, archive_retention=0, segment_size=4 << 10)
    assert seen["fallbacks"] >= 1, seen
    assert seen["start"] >= seen["snapshot"], seen
