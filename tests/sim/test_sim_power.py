"""Power cuts in the simulator (issue 44, item 3): members lose what they had not made
durable (``tests/sim/disk.py``), and the checker's invariants still hold: nothing
acknowledged is lost, every member restarts by itself, the members converge."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.archive.segments import FsyncPolicy

from .harness import SimCluster, SimFailure
from .test_sim import _compact_without, _in_the_middle_of_a_transfer, _installs, _node, _sim


async def _outages(
    sim: SimCluster,
    rounds: int,
    victims: list[int] | None = None,
    mid_operation: random.Random | None = None,
) -> None:
    """``rounds`` power cuts under load (of ``victims``, or every member), each member
    started again a moment later (``mid_operation``: see :meth:`SimCluster.power_cut`)."""
    if not sim.clients:
        await sim.start_workload()
    await sim.wait_for_leader()
    for round_ in range(rounds):
        await sim.sleep(0.4 + 0.13 * round_)
        cut = list(range(len(sim.nodes))) if victims is None else victims
        await sim.power_cut(cut, mid_operation=mid_operation)
        await sim.sleep(0.3)
        for i in cut:
            await sim.restart(i)
        await sim.wait_for_leader(10.0)


@pytest.mark.parametrize(
    "archive_io",
    [
        pytest.param("inline", marks=pytest.mark.slow),
        "thread",
        pytest.param("auto", marks=pytest.mark.slow),
    ],
)
def test_an_outage_of_every_member_loses_nothing_acknowledged(
    tmp_path: Path, archive_io: str
) -> None:
    """A data-centre outage, five times under load, with small segments (a new file,
    and its directory synced, every 4 KiB): every acknowledged write is in every
    member's store at the end, and every member restarted by itself each time."""

    async def scenario(sim: SimCluster) -> None:
        await _outages(sim, 5)

    sim, result = _sim(
        31, 3, tmp_path, scenario, clients=3, segment_size=4 << 10, archive_io=archive_io
    )
    assert result.stats["power_cuts"] == 15
    assert sim.disk.stats["syncs"] > 100
    assert len(sim.history.acked) > 50


@pytest.mark.parametrize(
    "seed", [35, pytest.param(36, marks=pytest.mark.slow), pytest.param(37, marks=pytest.mark.slow)]
)
def test_outages_in_the_middle_of_disk_operations(tmp_path: Path, seed: int) -> None:
    """The power goes just before a random disk change (a write, a sync, a rename, a
    creation...) of each member, in the middle of whatever it was doing (an append and
    its sync, a snapshot, a node-state save, a segment's creation, a compaction), one
    member at a time and all together: nothing acknowledged is lost, every member
    starts again by itself."""

    async def scenario(sim: SimCluster) -> None:
        rng = random.Random(seed)
        await sim.start_workload()
        for round_ in range(6):
            victims = None if round_ % 2 else [rng.randrange(3)]
            if round_ == 2:
                sim.clients[0].request_snapshot()
            await _outages(sim, 1, victims, mid_operation=rng)

    sim, _ = _sim(seed, 3, tmp_path, scenario, clients=3, segment_size=4 << 10, archive_retention=1)
    assert sim.disk.stats["power_lost_mid_operation"] >= 6


def test_a_power_cut_of_one_member_and_then_a_minority(tmp_path: Path) -> None:
    async def scenario(sim: SimCluster) -> None:
        leader = await sim.wait_for_leader()
        await _outages(sim, 2, [leader])
        await _outages(sim, 2, [(leader + 1) % 5, (leader + 2) % 5])

    _, result = _sim(32, 5, tmp_path, scenario, clients=2, segment_size=4 << 10)
    assert result.stats["power_cuts"] == 6


def test_an_outage_just_after_the_first_snapshot_and_compaction(tmp_path: Path) -> None:
    """The first snapshot makes ``snapshots/`` and the compaction after it purges the
    log below it: an outage at once (before the member's next state save, which syncs
    the data directory) must leave every member able to start from what it holds."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(0.5)
        lagger = (leader + 1) % 3
        await sim.crash(lagger)
        await _compact_without(sim, lagger, snapshots=2)
        await sim.power_cut([0, 1, 2])
        await sim.sleep(0.3)
        for i in range(3):
            await sim.restart(i)
        await sim.wait_for_leader(10.0)
        await sim.sleep(1.0)

    _, result = _sim(
        33, 3, tmp_path, scenario, clients=3, archive_retention=1, segment_size=4 << 10
    )
    assert result.stats["compactions"] >= 1


@pytest.mark.parametrize("when", ["mid-transfer", "after-install"])
def test_a_power_cut_of_a_member_receiving_a_snapshot(tmp_path: Path, when: str) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(0.5)
        lagger = (leader + 1) % 3
        await sim.crash(lagger)
        await _compact_without(sim, lagger)
        await sim.restart(lagger)
        if when == "mid-transfer":
            await _in_the_middle_of_a_transfer(sim, lagger)
        else:
            await sim.wait_for("an install", lambda: _installs(sim, lagger) >= 1, 10.0)
            assert _node(sim, lagger).archive.start_position > 0
        await sim.power_cut([lagger])
        await sim.sleep(0.2)
        await sim.restart(lagger)
        await sim.sleep(2.0)

    _sim(34, 3, tmp_path, scenario, clients=3, segment_size=4 << 10)


def test_without_syncs_a_power_cut_loses_what_was_acknowledged(tmp_path: Path) -> None:
    """The model has teeth: members that never sync their log (``--fsync none``) lose
    committed log in an outage, and the checker says so."""

    async def scenario(sim: SimCluster) -> None:
        await _outages(sim, 2)

    with pytest.raises(SimFailure, match=r"below its committed position|acknowledged write"):
        _sim(31, 3, tmp_path, scenario, clients=3, fsync=FsyncPolicy.NONE)
