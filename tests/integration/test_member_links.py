"""A peer's bytes on the consensus port, sent as an attacker would: from another
connection on loopback, with the project's own encoders, against a real cluster of
real nodes in this process (members 0 and 1 up, member 2 never started: the attacker
speaks as member 2, or as nobody).

Every member must stay up, keep acknowledged writes and go on acknowledging; each bad
message is a protocol error on that link (logged, counted, link closed)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

import client
from cluster.archive.record import append_record
from cluster.config import NodeConfig
from cluster.examples.kv import KeyValueClient, KeyValueService
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol import PROTOCOL_VERSION, encode_frame
from cluster.protocol.consensus import (
    APPEND_POSITION_VERIFIED,
    AppendPosition,
    AppendRequest,
    CommitPosition,
    MemberHello,
    RequestVote,
)


async def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        ports = free_ports(9)
        self.ports = ports
        members = ",".join(
            f"{i}=127.0.0.1:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(3)
        )
        self.ingress = ",".join(f"{i}=127.0.0.1:{ports[3 * i]}" for i in range(3))
        self.nodes = [
            Node(
                NodeConfig(
                    member_id=i,
                    members=members,
                    dir=str(tmp_path / f"n{i}"),
                    startup_canvass_timeout=500_000_000,
                    leader_heartbeat_timeout=2_000_000_000,
                    initial_cluster_state="new",  # two of three members, brand new
                ),
                KeyValueService(),
            )
            for i in range(2)
        ]

    def consensus_port(self, member: int) -> int:
        return self.ports[3 * member + 1]

    @property
    def leader(self) -> Node:
        (leader,) = [n for n in self.nodes if n.cm.is_ready_leader]
        return leader

    @property
    def follower(self) -> Node:
        (follower,) = [n for n in self.nodes if not n.cm.is_ready_leader]
        return follower


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    async with trio.open_nursery() as nursery:
        for node in c.nodes:
            await nursery.start(
                lambda task_status, node=node: node.run(
                    handle_signals=False, task_status=task_status
                )
            )
        await wait_for(lambda: any(n.cm.is_ready_leader for n in c.nodes), 30)
        try:
            yield c
        finally:
            for node in c.nodes:
                await node.shutdown()


async def send(port: int, *messages: object) -> bool:
    """Send frames to a consensus port; True if the member then closed the link."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"".join(encode_frame(m) for m in messages))  # type: ignore[arg-type]
        with trio.move_on_after(0.5):
            while True:
                try:
                    if not await stream.receive_some(1024):
                        return True
                except trio.BrokenResourceError:
                    return True
    return False


async def test_garbage_and_forged_member_messages_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with cluster(tmp_path) as c:
            async with (
                client.connect(c.ingress, connect_timeout=10) as cc,
                KeyValueClient(cc) as kv,
            ):
                await kv.put("before", b"1")
                leader, follower = c.leader, c.follower
                term = leader.cm.leadership_term_id
                me = leader.config.member_id
                hello = MemberHello(2, PROTOCOL_VERSION)
                # 1. garbage log bytes as the leader's append, to the follower, from
                # another member's link: refused at the link (a leader's own garbage is
                # refused by the follower's module: tests/unit/test_hardening.py)
                garbage = AppendRequest(term, me, 0, -1, term, 0, 0, bytes(range(16)))
                assert await send(c.consensus_port(follower.config.member_id), hello, garbage)
                # 2. valid records in the leader's name, from member 2's link: refused
                # (the sender named in a message is the member whose link brought it)
                records = bytearray()
                append_record(records, b"\x01" * 20)
                end = follower.cm.log.published_position
                forged = AppendRequest(term, me, end, term, term, 0, end + 28, bytes(records))
                assert await send(c.consensus_port(follower.config.member_id), hello, forged)
                assert follower.cm.log.published_position == end
                # as a second leader of the current term: refused by the module
                usurper = AppendRequest(term, 2, end, term, term, 0, end, bytes(records))
                assert await send(c.consensus_port(follower.config.member_id), hello, usurper)
                assert follower.cm.leader_member_id == me
                assert follower.cm.counters.invalid_messages == 1
                # 3. a report of 2**40 bytes verified, to the leader: refused by its
                # module, which has the link closed
                report = AppendPosition(term, 2**40, 2, APPEND_POSITION_VERIFIED)
                assert await send(c.consensus_port(me), hello, report)
                # 4. a commit position of the highest term
                commit = CommitPosition(2**63 - 1, 2**40, 2)
                assert await send(c.consensus_port(follower.config.member_id), hello, commit)
                # a hello from nobody, from another cluster, and a second hello for a
                # member whose link is live
                assert await send(c.consensus_port(me), MemberHello(7, PROTOCOL_VERSION))
                other_cluster = MemberHello(2, PROTOCOL_VERSION, 9)
                assert await send(c.consensus_port(me), other_cluster, report)
                live = MemberHello(follower.config.member_id, PROTOCOL_VERSION)
                assert await send(c.consensus_port(me), live)
                # 5. a storm of vote requests with ever higher terms
                for k in range(10):
                    await send(c.consensus_port(me), hello, RequestVote(0, 0, term + 1 + k, 2, 0))
                    await send(
                        c.consensus_port(follower.config.member_id),
                        hello,
                        RequestVote(0, 0, term + 100 + k, 2, 0),
                    )
                    await kv.put(f"during-{k}", b"x")
                # still the same leader, in the same term; everything acknowledged holds
                assert c.leader is leader
                assert leader.cm.leadership_term_id == term
                assert follower.cm.candidate_term_id == term
                assert leader.cm.commit_position <= leader.cm.log.archive_position
                assert follower.cm.commit_position <= follower.cm.log.archive_position
                assert leader.cm.counters.invalid_messages == 1  # the 2**40 report
                assert follower.links.protocol_errors >= 2
                assert leader.links.protocol_errors >= 2
                assert await kv.get("before") == b"1"
                assert await kv.get("during-9") == b"x"
