"""A session on a leader cut off from the other members, but not from its client, moves
to the new leader while the partition lasts (found by ``scripts/nemesis.py``, seed 44).

Three real members whose links to each other go through :class:`faultproxy.Forwarder`
proxies (``test_partition_catchup.py``); the client dials the members directly.  The
leader is cut off from the other two (nothing forwarded, nothing closed); the client
still reaches it.  The other two elect a leader within a heartbeat timeout and an
election; the deposed one, which knows no leader, answers the session's queries
NOT_LEADER and its resumes REDIRECT naming no leader, for as long as the partition
lasts.  Before, those answers counted as hearing from the leader, so the session stayed
with it and neither a linearizable query nor a write was answered until the heal (the
nemesis saw sessions stuck for a whole 8 s split).  Now they count as silence: within
:data:`BOUND` of the cut the session is at the new leader and both are answered, the
partition still on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from test_partition_catchup import HEARTBEAT_TIMEOUT, ProxiedCluster, proxied_cluster

import client
from client._ingress import LEADER_SILENCE
from cluster.examples.kv import KeyValueClient

CUT = 20.0
BOUND = HEARTBEAT_TIMEOUT + LEADER_SILENCE + 10.0
"""Seconds from the cut to answers from the new leader: the others' heartbeat timeout
(2 s) and election, the deposed leader's own timeout (it steps down), then
:data:`~client._ingress.LEADER_SILENCE` (3 s) of nothing but "not the leader" before the
client tries the next member, which sends it to the new leader; 10 s for a busy
machine (5.7-7.6 s measured while other tests ran).  Before, nothing was answered until
the heal (:data:`CUT`)."""


@pytest.mark.slow
def test_a_session_leaves_a_deposed_leader_it_can_still_reach(tmp_path: Path) -> None:
    figures: dict[str, float] = {}

    async def main() -> None:
        with trio.fail_after(180):
            async with proxied_cluster(tmp_path) as cluster:
                await cut_off_the_leader(cluster)

    async def cut_off_the_leader(cluster: ProxiedCluster) -> None:
        async with (
            client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
            KeyValueClient(c) as kv,
        ):
            await kv.put("k", b"before")
            assert await kv.get("k") == b"before"
            old = c.leader_member_id
            cut = cluster.cut(old)
            for proxy in cut:
                proxy.blackhole()
            began = trio.current_time()
            try:
                with trio.move_on_after(CUT - 1):
                    assert await kv.get("k") == b"before"
                    figures["read_s"] = trio.current_time() - began
                    await kv.put("k", b"during")
                    figures["write_s"] = trio.current_time() - began
                    figures["leader"] = c.leader_member_id
                    assert await kv.get("k") == b"during"
            finally:
                for proxy in cut:
                    proxy.heal()
            assert "write_s" in figures, f"nothing answered in {CUT - 1:g} s of the cut"
            assert figures["leader"] != old

    trio.run(main)
    print(
        f"\nthe leader cut off from the members only: a linearizable read answered "
        f"{figures['read_s']:.2f} s after the cut, a write {figures['write_s']:.2f} s"
    )
    assert figures["write_s"] <= BOUND, figures
