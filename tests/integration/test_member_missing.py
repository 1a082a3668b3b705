"""A cluster with a member down, with real ``python -m cluster.node`` processes and the
defaults an operator gets (a 10 s leader heartbeat timeout, a 1 s election timeout):

- every member stops, and two of the three start again: a leader within the start-up
  canvass timeout (500 ms) and an election timeout, not once the third is back (or the
  60 s the start-up canvass used to wait); writes go on, and the third catches up when
  it comes;
- meanwhile a stranger dials the live members' consensus ports as the member that is
  down (a plaintext cluster: its link is free to take) and sends an AppendRequest of a
  later term, with the project's own codec: both keep their leader and its term, and
  writes are acknowledged throughout (before, both followed the stranger and nothing
  was acknowledged for the heartbeat timeout, 10.9 s).

One cluster for the whole file.  ``pytest -s`` shows the figures.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from test_failover import (
    Load,
    archive_bytes,
    kv_session,
    local_cluster,
    report,
    running,
    unreadable,
    wait_for,
)

from cluster.local import LocalCluster
from cluster.members import members_digest, parse_members
from cluster.protocol import PROTOCOL_VERSION, encode_frame
from cluster.protocol.consensus import AppendRequest, MemberHello

pytestmark = pytest.mark.slow

NODE_ARGS = ["--session-timeout", "30s"]  # the rest as an operator gets them
MISSING = 2
ELECTION_BOUND = 3.0
"""Seconds from both members canvassing to a leader: 0.5 s of start-up canvass, at most
half the 1 s election timeout of nomination delay and a ballot, with a loaded machine's
room.  It was 60 s (the start-up canvass timeout) before."""
GAP_BOUND = 1.5
"""The longest a writer may go without an acknowledgement while the forgeries arrive
(one put started every 5 ms; commits take milliseconds)."""


def describe(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "describe", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return {m["member_id"]: m for m in json.loads(done.stdout)["members"]}


def log_lines(cluster: LocalCluster, member_id: int, since: int = 0) -> list[str]:
    """Member ``member_id``'s log lines after byte ``since`` of its log file."""
    data = (cluster.log_dir / f"node-{member_id}.log").read_bytes()[since:]
    return data.decode(errors="replace").splitlines()


def first_logged(lines: list[str], text: str) -> float | None:
    """When the first of ``lines`` containing ``text`` was logged (epoch seconds)."""
    for line in lines:
        if text in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


async def forge(port: int, message: AppendRequest, digest: bytes) -> None:
    """Dial a consensus port as member ``MISSING`` and send ``message``; leave the link
    open a moment so that it is read (and see whether the member closes it)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        hello = MemberHello(MISSING, PROTOCOL_VERSION, 0, digest)
        await stream.send_all(encode_frame(hello) + encode_frame(message))
        with trio.move_on_after(0.3):
            while await stream.receive_some(4096):
                pass


def test_a_member_down_neither_stops_an_election_nor_lends_its_name(tmp_path: Path) -> None:
    with local_cluster(3, tmp_path, NODE_ARGS) as cluster:
        trio.run(scenario, cluster)


async def scenario(cluster: LocalCluster) -> None:
    with trio.fail_after(240):
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_, kv):
            load = Load(kv, "before")
            async with running(load):
                await load.wait_acks_sent_after(0.0, 100, 30)
            acked = dict(load.acked)

        # every member stops; two start again
        await trio.to_thread.run_sync(cluster.stop_all)
        sizes = {i: (cluster.log_dir / f"node-{i}.log").stat().st_size for i in range(3)}
        for i in range(3):
            if i != MISSING:
                cluster.start(i)
        live = [i for i in range(3) if i != MISSING]

        def leader_logged() -> bool:
            return any(
                first_logged(log_lines(cluster, i, sizes[i]), "is LEADER of term") for i in live
            )

        await wait_for(leader_logged, 60, "a leader among the two members started")
        canvassing = max(
            first_logged(log_lines(cluster, i, sizes[i]), "enters election") or 0.0 for i in live
        )
        elected = min(
            t
            for i in live
            if (t := first_logged(log_lines(cluster, i, sizes[i]), "is LEADER of term"))
        )
        election = elected - canvassing

        async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
            assert await unreadable(kv, acked) == []
            leader, term = c.leader_member_id, c.leadership_term_id
            load = Load(kv, "after")
            async with running(load):
                await load.wait_acks_sent_after(0.0, 100, 30)
                # the forgeries: member 2's name, a later term (the next one, and one a
                # blind attacker would pick), to the leader and its follower
                digest = members_digest(parse_members(cluster.members))
                ports = {m.member_id: m.consensus_port for m in parse_members(cluster.members)}
                start = trio.current_time()
                for forged_term in itertools.islice(itertools.cycle([term + 1, term + 1000]), 6):
                    forged = AppendRequest(forged_term, MISSING, 0, -1, forged_term, 0, 0, b"")
                    for member in live:
                        await forge(ports[member], forged, digest)
                    await trio.sleep(0.5)
                await trio.sleep(2.0)
                end = trio.current_time()
                assert c.leader_member_id == leader
                assert c.leadership_term_id == term
            acks = sorted(a.acked for a in load.acks if start <= a.acked <= end)
            gap = max(b - a for a, b in itertools.pairwise([start, *acks, end]))
            status = await trio.to_thread.run_sync(lambda: describe(cluster))
            for member in live:
                assert status[member]["leadership_term_id"] == term
                assert status[member]["leader_member_id"] == leader
                assert any(
                    "ignores term" in line for line in log_lines(cluster, member, sizes[member])
                )
            assert await unreadable(kv, load.acked) == []

            # the third member comes back and catches up
            commit = int(status[leader]["commit_position"])
            came = trio.current_time()
            cluster.start(MISSING)

            def caught_up() -> bool:
                return len(archive_bytes(cluster, MISSING)) >= commit

            await wait_for(caught_up, 60, f"member {MISSING} to catch up to {commit}")
            caught = trio.current_time() - came
            status = await trio.to_thread.run_sync(lambda: describe(cluster))
            assert status[MISSING]["leader_member_id"] == leader
            assert status[MISSING]["leadership_term_id"] == term
            theirs = archive_bytes(cluster, MISSING)[:commit]
            assert theirs == archive_bytes(cluster, leader)[:commit]
            await kv.put("with all three", b"1")

    report(
        "restart without a member, forged later term",
        election=election,
        longest_gap_under_forgery=gap,
        forged_acks=len(acks),
        rejoin_caught_up=caught,
    )
    assert election < ELECTION_BOUND
    assert gap < GAP_BOUND
