"""Replies given while a client is between connections: Aeron's egress drops them;
Triarch's members keep them until the client confirms them, numbered, and the leader
sends what the client lacks once it resumes (exactly once out, issue 42).  A real node
run here under Trio, and a client speaking the protocol itself, so that it can be away
for exactly as long as the test says and say exactly what it received."""

from __future__ import annotations

from pathlib import Path

import trio
from test_node import make_config, running_node

from cluster.protocol import EGRESS, PROTOCOL_VERSION, FrameDecoder, encode_frame
from cluster.protocol.egress import NewLeaderEvent, SessionEvent
from cluster.protocol.enums import EventCode
from cluster.protocol.ingress import (
    SessionConnectRequest,
    SessionMessageHeader,
    SessionResumeRequest,
)
from cluster.service import ClientSession, Cluster, StatelessService


class Broadcast(StatelessService):
    """Every message is sent to every session."""

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        for each in self.cluster.client_sessions:
            each.offer(payload)


class RawSession:
    """One connection speaking the protocol: what arrived, in order."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.received: list[object] = []

    @classmethod
    async def dial(cls, port: int) -> RawSession:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, message: object) -> None:
        await self.stream.send_all(encode_frame(message))

    async def until(self, kind: type, count: int = 1) -> list[object]:
        while sum(isinstance(m, kind) for m in self.received) < count:
            data = await self.stream.receive_some(1 << 16)
            assert data, "closed"
            self.received += [EGRESS.decode(body) for body in self.decoder.feed(data)]
        return [m for m in self.received if isinstance(m, kind)]


async def open_raw(port: int, correlation_id: int) -> tuple[RawSession, SessionEvent]:
    raw = await RawSession.dial(port)
    await raw.send(SessionConnectRequest(correlation_id, 7, PROTOCOL_VERSION, ""))
    (ok,) = await raw.until(SessionEvent)
    assert isinstance(ok, SessionEvent)
    assert ok.code is EventCode.OK
    return raw, ok


async def broadcast_while_away(
    node_port: int, count: int
) -> tuple[RawSession, RawSession, SessionEvent, SessionEvent]:
    """Two sessions; the first goes away, the other has ``count`` messages broadcast."""
    away, granted = await open_raw(node_port, 1)
    other, other_ok = await open_raw(node_port, 2)
    term = granted.leadership_term_id
    await away.stream.aclose()  # gone, the session open
    await trio.sleep(0.2)  # the node notices
    for i in range(count):
        await other.send(
            SessionMessageHeader(term, other_ok.cluster_session_id, 0, b"%d" % i, i + 1)
        )
    await other.until(SessionMessageHeader, count)  # given: to it, and kept for us
    return away, other, granted, other_ok


async def resume(port: int, granted: SessionEvent, received: int) -> RawSession:
    back = await RawSession.dial(port)
    await back.send(
        SessionResumeRequest(
            3, granted.cluster_session_id, PROTOCOL_VERSION, granted.session_secret, received
        )
    )
    return back


def replies(raw: RawSession) -> list[tuple[int, bytes]]:
    return [(m.reply, m.payload) for m in raw.received if isinstance(m, SessionMessageHeader)]


async def test_replies_given_while_away_arrive_once_it_resumes(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_node(make_config(tmp_path), Broadcast()) as node:
            port = node.ingress_port
            _, other, granted, other_ok = await broadcast_while_away(port, 3)
            back = await resume(port, granted, 0)
            await back.until(SessionMessageHeader, 3)
            assert replies(back) == [(1, b"0"), (2, b"1"), (3, b"2")]
            # after the leader's word that it took the resume
            first = next(i for i, m in enumerate(back.received) if isinstance(m, NewLeaderEvent))
            assert all(not isinstance(m, SessionMessageHeader) for m in back.received[:first])
            # and what is given now arrives, numbered on
            await other.send(
                SessionMessageHeader(
                    granted.leadership_term_id, other_ok.cluster_session_id, 0, b"x", 4
                )
            )
            await back.until(SessionMessageHeader, 4)
            assert replies(back)[3:] == [(4, b"x")]
            # a resume that says it received up to 3 gets only what follows
            await back.stream.aclose()
            await trio.sleep(0.2)
            again = await resume(port, granted, 3)
            await again.until(SessionMessageHeader, 1)
            assert replies(again) == [(4, b"x")]
            await again.stream.aclose()
            await other.stream.aclose()


async def test_past_the_bound_the_oldest_go_and_the_gap_shows(tmp_path: Path) -> None:
    config = make_config(tmp_path, max_kept_replies=3 * (64 + 1))  # three 1-byte replies
    with trio.fail_after(30):
        async with running_node(config, Broadcast()) as node:
            port = node.ingress_port
            _, other, granted, _ = await broadcast_while_away(port, 5)
            back = await resume(port, granted, 0)
            await back.until(SessionMessageHeader, 3)
            assert replies(back) == [(3, b"2"), (4, b"3"), (5, b"4")]  # 1 and 2 are gone
            await back.stream.aclose()
            await other.stream.aclose()
