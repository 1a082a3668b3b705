"""Sessions that survive a leader's pause, and ends that say why (issue 32), with real
``python -m cluster.node`` processes.

- The leader is stopped (SIGSTOP) for 3.5, 6 and 9 s in turn, under the default 10 s
  leader heartbeat and session timeouts, with a writer running: its client gives up the
  silent connection after 3 s, a follower names the same leader, the client dials it
  again, and when the leader runs again the session is there (the leader does not count
  its own stall against it).  Every acknowledged write reads back.
- A session resumed on a second connection tells the first at once (CLOSED), and a
  resume of a session that timed out meanwhile hears TIMEOUT.
- A SUSPENDED cluster appends nothing: not a client's message, not a session open.
- SHUTDOWN and ABORT close every session with their reason, at once.

``pytest -s`` shows the figures.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from test_failover import Load, kv_session, local_cluster, report, running, unreadable
from test_handover import tool

import client
from cluster.local import LocalCluster
from cluster.protocol import EGRESS, FrameDecoder, encode_frame
from cluster.protocol.egress import NewLeaderEvent, SessionEvent
from cluster.protocol.enums import CloseReason, EventCode
from cluster.protocol.ingress import SessionConnectRequest, SessionResumeRequest
from cluster.protocol.version import PROTOCOL_VERSION

pytestmark = pytest.mark.slow

DEFAULTS = [  # the default 10 s leader heartbeat and session timeouts
    "--election-timeout",
    "500ms",
]
SHORT_SESSIONS = [*DEFAULTS, "--session-timeout", "3s"]


def positions(cluster: LocalCluster) -> dict[int, int]:
    """Every member's durable log end, from ``describe --json``."""
    document = json.loads(tool(cluster, "describe", "--json").stdout)
    return {m["member_id"]: m["append_position"] for m in document["members"]}


def address(cluster: LocalCluster, member_id: int) -> tuple[str, int]:
    for part in cluster.ingress_endpoints.split(","):
        member, _, endpoint = part.partition("=")
        if int(member) == member_id:
            host, _, port = endpoint.rpartition(":")
            return host, int(port)
    raise KeyError(member_id)


async def exchange(
    where: tuple[str, int],
    request: object,
    kinds: tuple[type, ...] = (SessionEvent,),
    limit: float = 10.0,
) -> object:
    """Send ``request`` on a new connection; the first message of ``kinds`` that comes
    back (the connection is closed then)."""
    with trio.fail_after(limit):
        stream = await trio.open_tcp_stream(*where)
        async with stream:
            await stream.send_all(encode_frame(request))
            decoder = FrameDecoder()
            while True:
                data = await stream.receive_some(1 << 16)
                assert data, "the member closed the connection without an answer"
                for body in decoder.feed(data):
                    message = EGRESS.decode(body)
                    if isinstance(message, kinds):
                        return message


# ---------------------------------------------------------------------- pauses


def test_a_paused_leader_keeps_every_session(tmp_path: Path) -> None:
    pauses: Sequence[float] = (3.5, 6.0, 9.0)

    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(240):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "pause", interval=0.01, max_in_flight=100)
                session = c.cluster_session_id
                async with running(load):
                    await load.wait_acks_sent_after(0.0, 100, 30)
                    for pause in pauses:
                        leader, term = c.leader_member_id, c.leadership_term_id
                        cluster.signal(leader, signal.SIGSTOP)
                        await trio.sleep(pause)
                        cluster.signal(leader, signal.SIGCONT)
                        back = trio.current_time()
                        await load.wait_acks_sent_after(back, 100, 30)
                        first = load.first_ack_sent_after(back)
                        assert first is not None
                        assert c.cluster_session_id == session
                        assert not c.is_closed
                        report(
                            f"leader {leader} paused {pause:g} s",
                            first_ack_after_resume=first.acked - back,
                            same_leader=int(
                                (c.leader_member_id, c.leadership_term_id) == (leader, term)
                            ),
                        )
                assert not c.is_closed
                assert await unreadable(kv, load.acked) == []
                report("paused leaders", acked=len(load.acked))

    with local_cluster(3, tmp_path, DEFAULTS) as cluster:
        trio.run(main, cluster)


# ---------------------------------------------------------------------- told at once


def test_the_owner_is_told_and_a_late_resume_hears_the_reason(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(120):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                leader = address(cluster, c.leader_member_id)
                secret = c._session.session_secret  # what a second holder would show
                resumed = trio.current_time()
                answer = await exchange(
                    leader,
                    SessionResumeRequest(77, c.cluster_session_id, PROTOCOL_VERSION, secret),
                    (SessionEvent, NewLeaderEvent),
                )
                assert isinstance(answer, NewLeaderEvent), answer  # the leader took it
                with trio.fail_after(5):  # at once, not after a 30 s request timeout
                    with pytest.raises(client.SessionClosedError) as closed:
                        await kv.put("after", b"x")
                report("owner told", after=trio.current_time() - resumed)
                assert closed.value.reason == "resumed on another connection"

            # a session whose client went away times out (3 s); its resume hears why
            raw = await exchange(leader, SessionConnectRequest(5, 7, PROTOCOL_VERSION, ""))
            assert isinstance(raw, SessionEvent)
            assert raw.code is EventCode.OK, raw
            await trio.sleep(6)
            sid = raw.cluster_session_id
            late = SessionResumeRequest(8, sid, PROTOCOL_VERSION, raw.session_secret)
            answer = await exchange(leader, late)
            assert isinstance(answer, SessionEvent)
            assert answer.code is EventCode.CLOSED
            assert answer.detail == CloseReason.TIMEOUT.name
            # whoever does not hold the secret learns nothing
            stranger = await exchange(
                leader, SessionResumeRequest(9, sid, PROTOCOL_VERSION, b"x" * 16)
            )
            assert isinstance(stranger, SessionEvent)
            assert stranger.detail == "no such open session"

    with local_cluster(3, tmp_path, SHORT_SESSIONS) as cluster:
        trio.run(main, cluster)


def test_a_suspended_cluster_appends_nothing_until_resumed(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(120):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                # the tool runs in a thread: this loop is the client's, and its keepalives
                # must go on (a tool call blocking it 3 s on a busy machine timed the
                # session out at RESUME)
                assert (await trio.to_thread.run_sync(tool, cluster, "suspend")).returncode == 0
                await trio.sleep(0.5)  # the SUSPEND entry commits everywhere
                before = await trio.to_thread.run_sync(positions, cluster)
                answered: list[str] = []

                async def put(key: str) -> None:
                    await kv.put(key, b"held")
                    answered.append(key)

                async def second_session() -> None:
                    async with client.connect(cluster.ingress_endpoints, connect_timeout=30):
                        answered.append("session")

                async with trio.open_nursery() as nursery:
                    for i in range(20):
                        nursery.start_soon(put, f"held-{i}")
                    nursery.start_soon(second_session)
                    await trio.sleep(4)  # past a session timeout (3 s) and many timer ticks
                    now = await trio.to_thread.run_sync(positions, cluster)
                    assert now == before, "an entry was appended while SUSPENDED"
                    assert answered == []
                    resumed = await trio.to_thread.run_sync(tool, cluster, "resume")
                    assert resumed.returncode == 0
                assert sorted(answered) == sorted([*(f"held-{i}" for i in range(20)), "session"])
                assert not c.is_closed  # not timed out while the module was suspended
                for i in range(20):
                    assert await kv.get(f"held-{i}") == b"held"

    with local_cluster(3, tmp_path, SHORT_SESSIONS) as cluster:
        trio.run(main, cluster)


# ---------------------------------------------------------------------- the cluster stops


@pytest.mark.parametrize("command", ["shutdown", "abort"])
def test_shutdown_and_abort_close_every_session_with_their_reason(
    tmp_path: Path, command: str
) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(120):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                for i in range(50):
                    await kv.put(f"{command}-{i}", b"before")
                asked = trio.current_time()
                done = await trio.to_thread.run_sync(lambda: tool(cluster, command))
                assert done.returncode == 0, done.stderr
                with trio.fail_after(5):  # at once, not after the connect timeout
                    with pytest.raises(client.SessionClosedError) as closed:
                        await kv.put("after", b"x")
                report(f"{command} seen by the client", after=trio.current_time() - asked)
                assert closed.value.close_reason is CloseReason[command.upper()]
                assert not isinstance(closed.value, client.SessionLostError)
                assert c.close_reason == command.upper()
        codes = [p.wait(30) for p in cluster.processes.values()]
        assert codes == [0, 0, 0]

    with local_cluster(3, tmp_path, DEFAULTS) as cluster:
        trio.run(main, cluster)
