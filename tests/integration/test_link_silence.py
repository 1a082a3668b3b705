"""Member links notice silence (issue 44, item 6): real sockets on loopback, member links
(:class:`PeerLinks`) in this process, with a short keepalive interval and bound.

- idle links stay up (each end sends a keepalive every interval);
- a blackhole (:class:`faultproxy.Forwarder`, both ways, nothing closed) closes both ends
  of both links within about the bound, and they come back after the heal;
- a reader held up (a long duty cycle, a slow disk) with bytes waiting in its socket is
  not a silent peer;
- a 2.0 member (no keepalives) is neither sent a second hello nor closed for its
  silence; a 2.1 member that falls silent is;
- a dial to a member that answered on its last link is watched from the start;
- a member dialling again replaces its own stale link (silent for three intervals), but
  not a live one;
- member and client sockets carry ``TCP_USER_TIMEOUT`` beside keepalive.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import pytest
import trio
from anyio.abc import SocketAttribute
from faultproxy import Forwarder

from client._dial import try_connect
from client._endpoints import Endpoint
from cluster.agents.consensus import PeerLinks
from cluster.agents.silence import silence_bound, unread_bytes
from cluster.config import members_digest, parse_members
from cluster.local import free_ports
from cluster.protocol.codec import CONSENSUS
from cluster.protocol.consensus import CommitPosition, ConsensusMessage, MemberHello
from cluster.protocol.framing import FrameDecoder, encode_frame
from cluster.protocol.version import PROTOCOL_VERSION, compose
from cluster.transport.tcp import TcpNetwork

HOST = "127.0.0.1"
WAIT = 30.0
"""Seconds to wait for what a busy two-core machine does in milliseconds."""
INTERVAL = 0.1
BOUND = 1.0
"""Ten intervals, as a node has them; both members share this process, so a stall of
the whole process longer than this would look like silence to both."""
OLD_VERSION = compose(2, 0, 0)


class Member:
    def __init__(
        self,
        members: str,
        member_id: int,
        own: str | None = None,
        delivered: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``own``: this member's own ``--members`` (the others' addresses through
        proxies), ``members`` the real one (its digest: the ids); ``delivered``: what
        the reader awaits after each read (the node's duty cycle)."""
        listed = parse_members(own or members)
        self.delivered: list[ConsensusMessage] = []
        self.links = PeerLinks(
            TcpNetwork(),
            next(m for m in listed if m.member_id == member_id),
            [m for m in listed if m.member_id != member_id],
            self.delivered.append,
            delivered=delivered,
            max_frame_size=1 << 20,
            hello_timeout=WAIT,
            members_digest=members_digest(parse_members(members)),
            unreachable_warning_interval=0,
            keepalive_interval=INTERVAL,
            silence_timeout=BOUND,
        )


def members_text(ports: list[int], count: int) -> str:
    return ",".join(
        f"{i}={HOST}:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(count)
    )


@asynccontextmanager
async def running(*members: Member) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for member in members:
            await nursery.start(member.links.run)
        yield
        nursery.cancel_scope.cancel()


async def wait_for(predicate: Callable[[], bool], limit: float = WAIT) -> None:
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


def commit(member_id: int) -> CommitPosition:
    return CommitPosition(1, 64, member_id)


def test_the_bound_follows_the_heartbeat_settings() -> None:
    assert silence_bound(0.2, 10.0) == 2.0  # the defaults: the floor
    assert silence_bound(0.5, 10.0) == 5.0  # ten intervals
    assert silence_bound(0.2, 1.5) == 1.5  # never past the heartbeat timeout...
    assert silence_bound(0.2, 0.5) == 0.8  # ...but never under four intervals


async def test_unread_bytes_counts_what_waits_in_the_socket() -> None:
    listeners = await trio.open_tcp_listeners(0, host=HOST)
    port = listeners[0].socket.getsockname()[1]
    async with listeners[0], await trio.open_tcp_stream(HOST, port) as dialled:
        accepted = await listeners[0].accept()
        async with accepted:
            assert unread_bytes(accepted) == 0
            await dialled.send_all(b"x" * 100)
            await wait_for(lambda: unread_bytes(accepted) == 100)
            assert await accepted.receive_some(1000) == b"x" * 100
            assert unread_bytes(accepted) == 0


async def test_idle_links_stay_up_and_a_blackhole_closes_them_both_ways() -> None:
    ports = free_ports(8)
    real = members_text(ports, 2)
    zero_to_one = Forwarder(ports[3 + 1], port=ports[6])
    one_to_zero = Forwarder(ports[1], port=ports[7])
    own = [
        f"0={HOST}:{ports[0]}:{ports[1]}:{ports[2]},1={HOST}:{ports[3]}:{ports[6]}:{ports[5]}",
        f"0={HOST}:{ports[0]}:{ports[7]}:{ports[2]},1={HOST}:{ports[3]}:{ports[4]}:{ports[5]}",
    ]
    zero, one = Member(real, 0, own[0]), Member(real, 1, own[1])
    out0, out1 = zero.links.links[1], one.links.links[0]
    async with trio.open_nursery() as proxies:
        await proxies.start(zero_to_one.run)
        await proxies.start(one_to_zero.run)
        async with running(zero, one):
            # (a first dial through a proxy may meet a member not listening yet)
            await wait_for(lambda: bool(zero.links.inbound) and bool(one.links.inbound))
            connects = (out0.connects, out1.connects)
            await trio.sleep(3 * BOUND)  # idle: only keepalives
            assert (out0.connects, out1.connects) == connects
            assert (out0.silences, out1.silences) == (0, 0)
            assert zero.links.silent_inbound == one.links.silent_inbound == 0

            zero_to_one.blackhole()
            one_to_zero.blackhole()
            cut = trio.current_time()
            await wait_for(lambda: out0.silences == out1.silences == 1)
            await wait_for(lambda: zero.links.silent_inbound == one.links.silent_inbound == 1, 5)
            noticed = trio.current_time() - cut
            assert noticed >= BOUND  # never before the bound
            await wait_for(lambda: "silent for" in out0.last_error)

            zero_to_one.heal()
            one_to_zero.heal()
            await wait_for(lambda: out0.is_connected and out1.is_connected)
            assert out0.send(commit(0))
            out0.flush()
            await wait_for(lambda: commit(0) in one.delivered)
        proxies.cancel_scope.cancel()


async def test_a_reader_held_up_is_not_a_silent_peer() -> None:
    ports = free_ports(6)
    real = members_text(ports, 2)
    stalls = [2 * BOUND]

    async def slow_duty_cycle() -> None:  # the first read's cycle takes two bounds
        if stalls:
            await trio.sleep(stalls.pop())

    zero, one = Member(real, 0), Member(real, 1, delivered=slow_duty_cycle)
    out0 = zero.links.links[1]
    async with running(zero, one):
        await wait_for(lambda: bool(one.links.inbound) and out0.is_connected)
        for n in range(int(3 * BOUND / INTERVAL)):
            assert out0.send(CommitPosition(1, n, 0))
            out0.flush()
            await trio.sleep(INTERVAL)
        await wait_for(lambda: len(one.delivered) == int(3 * BOUND / INTERVAL))
        assert not stalls, "the reader was held up"
        assert one.links.silent_inbound == 0
        assert (out0.connects, out0.silences) == (1, 0)


async def hello_frames(stream: trio.abc.Stream, seconds: float) -> list[MemberHello] | None:
    """The frames ``stream`` brings in ``seconds`` (all hellos), or None if it closed."""
    decoder = FrameDecoder(1 << 16)
    frames: list[ConsensusMessage] = []
    with trio.move_on_after(seconds):
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                return None
            decoder.decode_into(data, CONSENSUS, frames)
    assert all(isinstance(f, MemberHello) for f in frames)
    return [f for f in frames if isinstance(f, MemberHello)]


async def test_a_2_0_member_is_never_held_to_keepalives() -> None:
    ports = free_ports(6)
    real = members_text(ports, 2)
    member = Member(real, 1)
    digest = members_digest(parse_members(real))
    old_hello = encode_frame(MemberHello(0, OLD_VERSION, 0, digest))
    new_hello = encode_frame(MemberHello(0, PROTOCOL_VERSION, 0, digest))
    async with trio.open_nursery() as nursery:
        # member 1 dials member 0: a 2.0 member, which never answers
        dialled: list[bytes] = []
        listeners = await trio.open_tcp_listeners(ports[1], host=HOST)

        async def old_peer(stream: trio.SocketStream) -> None:
            while data := await stream.receive_some(1 << 16):
                dialled.append(bytes(data))

        nursery.start_soon(trio.serve_listeners, old_peer, listeners)
        async with running(member):
            link = member.links.links[0]
            await wait_for(lambda: bool(dialled))

            # a 2.0 member dialling in: keepalives sent to it, its silence not held against it
            async with await trio.open_tcp_stream(HOST, ports[4]) as old:
                await old.send_all(old_hello)
                hellos = await hello_frames(old, 3 * BOUND)
                assert hellos is not None, "closed for the silence of a 2.0 member"
                assert len(hellos) >= BOUND / INTERVAL
                assert all(h.member_id == 1 and h.members_digest == digest for h in hellos)

            # a 2.1 member dialling in and falling silent is closed after about the bound
            async with await trio.open_tcp_stream(HOST, ports[4]) as new:
                await new.send_all(new_hello)
                started = trio.current_time()
                assert await hello_frames(new, WAIT) is None
                assert trio.current_time() - started >= BOUND

            # meanwhile our link to the 2.0 member: one hello, never closed
            assert b"".join(dialled) == encode_frame(MemberHello(1, PROTOCOL_VERSION, 0, digest))
            assert (link.connects, link.silences) == (1, 0)
        nursery.cancel_scope.cancel()


async def test_a_stale_link_is_replaced_by_its_member_dialling_again() -> None:
    ports = free_ports(6)
    real = members_text(ports, 2)
    member = Member(real, 1)
    digest = members_digest(parse_members(real))
    hello = encode_frame(MemberHello(0, PROTOCOL_VERSION, 0, digest))
    async with running(member):
        async with await trio.open_tcp_stream(HOST, ports[4]) as first:
            await first.send_all(hello)
            await wait_for(lambda: member.links.inbound.get(0) == 1)
            # live: keeps sending keepalives; a second hello is refused
            async with await trio.open_tcp_stream(HOST, ports[4]) as second:
                await second.send_all(hello)
                for _ in range(10):
                    await first.send_all(hello)
                    await trio.sleep(INTERVAL / 2)
                assert await hello_frames(second, WAIT) is None
            assert member.links.inbound[0] == 1
            # stale: silent for more than three intervals (less than the bound)
            await trio.sleep(6 * INTERVAL)
            async with await trio.open_tcp_stream(HOST, ports[4]) as third:
                await third.send_all(hello)
                assert await hello_frames(first, WAIT) is None  # the stale one closed
                await wait_for(lambda: member.links.inbound[0] == 2)
                frames = await hello_frames(third, 2 * INTERVAL)
                assert frames, "the new link is served"


async def test_member_and_client_sockets_give_up_on_unacknowledged_data() -> None:
    """``TCP_USER_TIMEOUT`` beside keepalive: a send blocked across a partition fails in
    15 s, not after the kernel's ~15 minutes of retransmissions."""
    listeners = await trio.open_tcp_listeners(0, host=HOST)
    port = listeners[0].socket.getsockname()[1]
    async with listeners[0]:
        member = await TcpNetwork().open_stream(HOST, port)
        assert isinstance(member, trio.SocketStream)
        async with member:
            assert member.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 15_000
            assert member.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        dialled = await try_connect(Endpoint(HOST, port))
        assert not isinstance(dialled, str), dialled
        async with dialled:
            sock = dialled.extra(SocketAttribute.raw_socket)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 15_000
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)


@pytest.mark.slow
async def test_a_dial_to_a_member_that_spoke_before_is_held_to_it_at_once() -> None:
    """A 2.1 peer answered on its last link: the next link is watched from its first
    moment (a dial that got through just before a cut is not left to the kernel), but
    no keepalive goes to it before it answers on that link; a link closed that way with
    no answer at all forgets (the peer may be a 2.0 member again)."""
    ports = free_ports(6)
    real = members_text(ports, 2)
    digest = members_digest(parse_members(real))
    member = Member(real, 1)
    received: list[bytes] = []
    closed = [trio.Event() for _ in range(3)]
    answer = encode_frame(MemberHello(0, PROTOCOL_VERSION, 0, digest))

    async def peer(stream: trio.SocketStream) -> None:
        index = len(received)
        received.append(b"")
        if index == 0:
            await stream.send_all(answer)  # the first link: answered, then silence
        with suppress(trio.BrokenResourceError):
            while data := await stream.receive_some(1 << 16):
                received[index] += data
        closed[min(index, 2)].set()

    listeners = await trio.open_tcp_listeners(ports[1], host=HOST)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, peer, listeners)
        async with running(member):
            link = member.links.links[0]
            with trio.fail_after(WAIT):
                await closed[0].wait()  # answered, then silent: closed
                await closed[1].wait()  # never answered, watched at once: closed
            assert link.silences == 2
            assert not link.keepalives
            hello = encode_frame(MemberHello(1, PROTOCOL_VERSION, 0, digest))
            assert received[0].startswith(hello + hello)  # keepalives once it answered
            assert received[1] == hello  # none before an answer
            await trio.sleep(3 * BOUND)  # the third: not watched, never closed
            assert len(received) == 3
            assert not closed[2].is_set()
            assert link.silences == 2
        nursery.cancel_scope.cancel()
