"""Issue 33 in the simulator: a snapshot transfer that stops because its leader crashed
is dropped by the receiving member at once (its temporary file removed, no restart
needed), and the next leader's transfer installs."""

from __future__ import annotations

from pathlib import Path

import trio

from .harness import SimCluster
from .test_sim import _compact_without, _installs, _node, _sim


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

        def in_the_middle() -> bool:
            sn = sim.nodes[lagger]
            cm = getattr(sn.node, "cm", None) if sn.running else None
            receiver = cm.replica.snapshot if cm is not None else None
            return receiver is not None and receiver.offset > 0 and receiver.complete is None

        with trio.fail_after(10):
            while not in_the_middle():  # noqa: ASYNC110 (node state: nothing signals it)
                await trio.sleep(0.0005)
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
