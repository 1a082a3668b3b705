"""Clock steps in the simulator (issue 44, item 5): cluster time never goes back in the
log (invariant 11, ``tests/sim/clocks.py``), leader changes and restarts included."""

from __future__ import annotations

from pathlib import Path

import pytest

from .clocks import CLOCK_STEP
from .harness import SimCluster
from .test_sim import _node, _sim

MINUTE_NS = 60 * 1_000_000_000


@pytest.mark.parametrize("seed", [3])
def test_seeds_that_found_a_new_leader_stamping_before_its_predecessor(
    tmp_path: Path, seed: int
) -> None:
    """Seed 3 (3 members) found it once cluster time followed the wall clock: a new
    leader, its clock 15 ms behind the old one's (the seeds' skew), stamped its
    NewLeadershipTermEvent before the old leader's last entries, which it held but had
    not applied (fixed: AppendRequest carries the leader's cluster time)."""
    _, result = _sim(seed, 3, tmp_path)
    assert result.stats["clock_steps"] > 0


def test_a_member_restarted_with_its_clock_behind_never_stamps_before_its_log(
    tmp_path: Path,
) -> None:
    """The leader's clock jumps two minutes ahead; its next writes reach every member,
    and then every member stops at once, before the followers saved the commit position
    that covers them (about once a second): on restart those entries are the tail of
    their logs, not replayed.  The followers, their clocks two minutes behind, elect one
    of them: its first entry must not be stamped before that tail."""

    async def scenario(sim: SimCluster) -> None:
        old = await sim.wait_for_leader()
        await sim.write()
        await sim.sleep(1.5)  # a node-state save behind us: the next is ~1 s away
        sim.step_clock(old, 2 * MINUTE_NS)
        await sim.sleep(0.05)  # a slow tick: the leader reads its clock
        ahead = _node(sim, old).cm.log.cluster_time(_node(sim, old).now_ns())
        await sim.write()
        for i in range(3):
            await sim.crash(i)
        others = [i for i in range(3) if i != old]
        for i in others:
            await sim.restart(i)
        new = await sim.wait_for_leader()
        assert new != old
        node = _node(sim, new)
        assert (node.now_ns() + node.cm.log.epoch_offset_ns) // 1_000_000 < ahead - 60_000
        await sim.write()
        assert node.cm.log.timestamp >= ahead
        # the checker (invariant 11) reads the committed log every 10 ms and at the end

    _sim(11, 3, tmp_path, scenario, faults=(CLOCK_STEP,), clients=0)
