"""Nothing is unbounded before authentication: strangers on every port of a real node
(real sockets on loopback); a real node process at a low descriptor limit is in
``test_accept_bounds.py``.

Issue #18 measured: one unauthenticated process held all session slots, idle and
slowloris connections were never closed, 300 half-sent 1 MiB frames took a node to
375 MiB, and running out of descriptors locked everyone out and flooded the log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

import client
from cluster.config import NodeConfig
from cluster.core.auth import Authenticator
from cluster.examples.auth import SharedSecretAuthenticator, SharedSecretCredentials
from cluster.examples.echo import EchoService
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol import EGRESS, PROTOCOL_VERSION, EventCode, FrameDecoder, encode_frame
from cluster.protocol.egress import SessionEvent
from cluster.protocol.framing import LENGTH
from cluster.protocol.ingress import SessionConnectRequest

SECRET = b"app-secret"


async def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


@asynccontextmanager
async def node(
    tmp_path: Path, authenticator: Authenticator | None = None, **settings: object
) -> AsyncIterator[Node]:
    ports = free_ports(3)
    config = NodeConfig(
        members=f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}",
        dir=str(tmp_path / "node"),
        **{"handshake_timeout": 500_000_000, **settings},  # type: ignore[arg-type]
    )
    n = Node(config, EchoService(), authenticator=authenticator)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: n.run(handle_signals=False, task_status=task_status)
        )
        await wait_for(lambda: n.cm.is_ready_leader)
        try:
            yield n
        finally:
            await n.shutdown()


async def dial(port: int, source: str = "127.0.0.1") -> trio.SocketStream:
    """A stranger's connection, from the loopback address ``source``.  One the member
    refuses at accept is reset at once, which may be before the connect is seen to
    finish: its stream then reads as closed (an error)."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    try:
        await sock.connect(("127.0.0.1", port))
    except ConnectionResetError:
        pass
    return trio.SocketStream(sock)


async def closed_within(stream: trio.SocketStream, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        try:
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, OSError):
            pass
        return True
    return False


async def echo_works(n: Node, **kwargs: object) -> None:
    async with client.connect(f"0=127.0.0.1:{n.ingress_port}", connect_timeout=5, **kwargs) as c:  # type: ignore[arg-type]
        await c.offer(b"still here")
        assert await c.receive() == b"still here"


async def test_idle_and_half_sent_frames_are_closed_and_cost_little(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with node(tmp_path) as n:
            port = n.ingress_port
            # idle: says nothing; slowloris: half of a 64 KiB connect request
            idle = await dial(port)
            slow = await dial(port)
            await slow.send_all(LENGTH.pack(60_000) + b"\x00" * 30_000)
            # a frame header announcing a megabyte, before any session: closed at once
            big = await dial(port)
            await big.send_all(LENGTH.pack(1 << 20) + b"\x00" * 1000)
            assert await closed_within(big, 0.3)
            assert await closed_within(idle, 2.0)
            assert await closed_within(slow, 2.0)
            assert n.ingress.stats.idle_closed >= 2
            # a client with a session keeps its connection well past the deadline
            async with client.connect(f"0=127.0.0.1:{port}", connect_timeout=5) as c:
                await trio.sleep(1.5)
                await c.offer(b"after the deadline")
                assert await c.receive() == b"after the deadline"
                # and may send frames larger than a stranger may
                await c.offer(b"x" * 200_000)
                assert len(await c.receive()) == 200_000
            for s in (idle, slow, big):
                await s.aclose()


async def test_connection_limit_on_the_ingress_and_admin_ports(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with node(tmp_path, max_connections=4, max_admin_connections=2) as n:
            held = [await dial(n.ingress_port) for _ in range(4)]
            await wait_for(lambda: len(n.ingress.sources) == 4)
            extra = await dial(n.ingress_port)
            assert await closed_within(extra, 0.5)
            assert n.ingress.gate.refused == 1
            admin_port = n.admin_endpoint[1]
            admins = [await dial(admin_port) for _ in range(2)]
            await trio.sleep(0.1)
            extra_admin = await dial(admin_port)
            assert await closed_within(extra_admin, 0.5)
            # the strangers' connections end at the handshake deadline: room again
            for s in held:
                assert await closed_within(s, 2.0)
            await echo_works(n)
            for s in [*held, extra, *admins, extra_admin]:
                await s.aclose()


async def test_pending_sessions_are_bounded_per_address_and_apart_from_open_ones(
    tmp_path: Path,
) -> None:
    auth = SharedSecretAuthenticator({b"app": SECRET})
    with trio.fail_after(30):
        async with node(
            tmp_path, auth, max_concurrent_sessions=2, handshake_timeout=5_000_000_000
        ) as n:
            port = n.ingress_port
            # one stranger (127.0.0.2) sends connect requests and never answers the challenge
            strangers = []
            answers: list[SessionEvent | object] = []
            for i in range(6):
                s = await dial(port, "127.0.0.2")
                await s.send_all(
                    encode_frame(SessionConnectRequest(i, 0, PROTOCOL_VERSION, "", b"app"))
                )
                decoder = FrameDecoder()
                frames: list[bytes] = []
                while not frames:
                    frames = decoder.feed(await s.receive_some(4096))
                answers.append(EGRESS.decode(frames[0]))
                strangers.append(s)
            refused = [a for a in answers if isinstance(a, SessionEvent)]
            assert len(refused) == 2  # the 5th and 6th: four may be connecting at once
            assert all(a.code is EventCode.ERROR for a in refused)
            assert "too many sessions connecting from 127.0.0.2" in refused[0].detail
            # they hold no open-session slot: a real client still gets a session
            await echo_works(n, credentials=SharedSecretCredentials(b"app", SECRET))
            for s in strangers:
                await s.aclose()
            await wait_for(lambda: auth.pending_state == 0, 5)  # freed with them


async def test_a_consensus_connection_must_say_hello_in_time(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with node(tmp_path) as n:
            port = n.member.consensus_port
            before = n.links.protocol_errors
            silent = await dial(port)
            assert await closed_within(silent, 2.0)
            # more unidentified connections than members could make: closed at once
            flood = [await dial(port) for _ in range(10)]
            closed = 0
            for s in flood:
                closed += await closed_within(s, 0.2)
            assert closed >= 6
            assert n.links.protocol_errors > before
            for s in [silent, *flood]:
                await s.aclose()


async def test_an_idle_or_half_sent_admin_connection_is_closed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with node(tmp_path, admin_idle_timeout=500_000_000) as n:
            port = n.admin_endpoint[1]
            idle = await dial(port)
            slow = await dial(port)
            await slow.send_all(LENGTH.pack(1000) + b"\x00" * 10)  # half a command
            assert await closed_within(idle, 2.0)
            assert await closed_within(slow, 2.0)
            for s in (idle, slow):
                await s.aclose()
