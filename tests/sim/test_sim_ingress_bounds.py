"""Issue 33 in the simulator: strangers flooding every port a member serves, before any
byte is trusted, from several hosts (``ingress_adversary.py``), while the workload runs
and the checker checks every step.  A client from another host must get in and write
all the while, the members' bounds must hold at every step, and the cluster must
converge after.

The bounds are lowered so that a few dozen simulated connections reach them: 32
ingress connections (4 an address), 8 open sessions, 8 pending sessions, 256 KiB of
strangers' unfinished frames.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio

import cluster.agents.ingress as ingress_module

from .harness import SimCluster
from .ingress_adversary import IngressFlood
from .test_sim import _sim

PARTIAL_BUDGET = 256 << 10
FLOOD = 8.0
"""Virtual seconds of flood."""
BOUNDS: dict[str, Any] = {
    "max_connections": 32,
    "max_connections_per_address": 4,
    "max_concurrent_sessions": 8,
    "max_pending_sessions": 8,
    "handshake_timeout": 1_000_000_000,
}


@pytest.fixture(autouse=True)
def _small_partial_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingress_module, "PARTIAL_BUDGET", PARTIAL_BUDGET)


def _running(sim: SimCluster) -> list[Any]:
    return [sn.node for sn in sim.nodes if sn.running and sn.node is not None]


def _total(sim: SimCluster, read: Any) -> int:
    total = 0
    for node in _running(sim):
        try:
            total += int(read(node))
        except AttributeError:  # a node still starting
            pass
    return total


class Bounds:
    """Checks the members' bounds every few virtual milliseconds while the flood runs."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.most_partial = 0
        self.most_open = 0

    async def watch(self) -> None:
        while True:
            for node in _running(self.sim):
                ingress = getattr(node, "ingress", None)
                if ingress is None:
                    continue
                assert ingress.partial_bytes <= PARTIAL_BUDGET, "unfinished frames over budget"
                assert ingress.gate.open <= BOUNDS["max_connections"]
                for count in ingress.gate.by_address.values():
                    assert count <= ingress.gate.share, "an address over its share"
                self.most_partial = max(self.most_partial, ingress.partial_bytes)
                self.most_open = max(self.most_open, ingress.gate.open)
                sessions = node.cm.session_manager
                assert len(sessions.admission.pending_sessions) <= BOUNDS["max_pending_sessions"]
            await trio.sleep(0.005)


async def _probe_writes(sim: SimCluster, until: float, within: float) -> int:
    """A write through a fresh client (its own host) every half second until ``until``;
    each must be acknowledged within ``within`` virtual seconds."""
    writes = 0
    while trio.current_time() < until:
        await sim.write(within)
        writes += 1
        await sim.sleep(0.5)
    return writes


def test_strangers_flooding_every_port_keep_no_client_out(tmp_path: Path) -> None:
    """Idle connects (a TLS port before its handshake), half-sent frames, sessions
    dropped without a close, garbage, and idle admin and consensus connections, from three
    hosts (points 1, 2, 4 and 5); a follower restarts in the middle and must rejoin
    through the flooded consensus ports."""
    seen: dict[str, Any] = {}

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        flood = IngressFlood(
            sim,
            random.Random("flood-1"),
            hosts=3,
            workers=12,
            kinds=(
                "idle",
                "half_frame",
                "dropped_session",
                "garbage",
                "admin_idle",
                "consensus_idle",
            ),
        )
        bounds = Bounds(sim)
        follower = (leader + 1) % 3
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood.run, FLOOD)
            nursery.start_soon(bounds.watch)
            await sim.sleep(1.0)
            writes = await _probe_writes(sim, trio.current_time() + 2.0, within=3.0)
            await sim.crash(follower)
            await sim.sleep(0.5)
            await sim.restart(follower)
            writes += await _probe_writes(sim, trio.current_time() + FLOOD - 4.0, within=3.0)
            seen["refused"] = _total(sim, lambda n: n.ingress.gate.refused)
            seen["partial_refused"] = _total(sim, lambda n: n.ingress.stats.partial_refused)
            seen["idle_closed"] = _total(sim, lambda n: n.ingress.stats.idle_closed)
            seen["given_back"] = _total(sim, lambda n: n.cm.counters.sessions_given_back)
            await sim.wait_for(
                "the restarted follower rejoined through the flooded consensus ports",
                lambda: (
                    sim.nodes[follower].running
                    and _total_applied(sim, follower) >= _node_commit(sim, leader)
                ),
                FLOOD,
            )
            nursery.cancel_scope.cancel()
        seen.update(flood.stats, writes=writes, most_partial=bounds.most_partial)

    _sim(21, 3, tmp_path, scenario, clients=3, **BOUNDS)
    assert seen["writes"] >= 4, seen
    assert seen["connects"] > 100, seen
    assert seen["refused"] > 0, seen  # over an address's share, counted at accept
    assert seen["partial_refused"] > 0, seen
    assert seen["idle_closed"] > 0, seen
    assert seen["sessions_opened"] > 8, seen
    assert seen["given_back"] > 0, seen


def _node_commit(sim: SimCluster, i: int) -> int:
    node = sim.nodes[i].node
    return int(node.cm.commit_position) if node is not None else 1 << 62


def _total_applied(sim: SimCluster, i: int) -> int:
    node = sim.nodes[i].node
    log_agent = getattr(node, "log_agent", None)
    return int(log_agent.applied_position) if log_agent is not None else -1


def test_never_answered_connect_requests_keep_no_authenticated_client_out(
    tmp_path: Path,
) -> None:
    """Point 3: connect requests that never answer their challenge, from four hosts,
    four times more than the pending slots, beside clients with the right secret."""
    seen: dict[str, Any] = {}

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        await sim.wait_for_leader()
        flood = IngressFlood(
            sim,
            random.Random("flood-3"),
            hosts=4,
            workers=4,
            kinds=("silent_connect",),
            hold=(2.0, 5.0),
        )
        bounds = Bounds(sim)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood.run, FLOOD)
            nursery.start_soon(bounds.watch)
            await sim.sleep(1.0)
            seen["writes"] = await _probe_writes(sim, trio.current_time() + FLOOD - 1.5, within=3.0)
            seen["evicted"] = _total(sim, lambda n: n.cm.counters.evicted_pending_sessions)
            nursery.cancel_scope.cancel()
        seen.update(flood.stats)

    _sim(22, 3, tmp_path, scenario, clients=3, authenticate=True, **BOUNDS)
    assert seen["writes"] >= 8, seen
    assert seen["challenged"] > 20, seen
    assert seen["sessions_opened"] == 0, seen
    assert seen["evicted"] > 0, seen


def test_strangers_holding_the_consensus_ports_keep_no_member_out(tmp_path: Path) -> None:
    """Idle connections to the consensus ports, more than a member's slots for links that
    have not said hello, held until closed and dialled again at once: a follower that
    restarts in the middle must still get its links up and catch up."""
    seen: dict[str, Any] = {}

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        flood = IngressFlood(
            sim,
            random.Random("flood-consensus"),
            hosts=3,
            workers=8,
            kinds=("consensus_idle",),
            hold=(5.0, 10.0),
        )
        follower = (leader + 1) % 3
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood.run, FLOOD)
            await sim.sleep(1.0)
            await sim.crash(follower)
            await sim.sleep(0.5)
            await sim.restart(follower)
            await sim.wait_for(
                "the restarted follower rejoined through the flooded consensus ports",
                lambda: _total_applied(sim, follower) >= _node_commit(sim, leader) > 0,
                FLOOD - 2.0,
            )
            seen["writes"] = await _probe_writes(sim, trio.current_time() + 1.0, within=3.0)
            nursery.cancel_scope.cancel()
        seen.update(flood.stats)

    _sim(23, 3, tmp_path, scenario, clients=3, **BOUNDS)
    assert seen["writes"] >= 1, seen
