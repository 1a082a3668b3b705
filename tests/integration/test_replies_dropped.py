"""Replies sent while a client is between connections (issue 32): the node drops them,
as Aeron's egress does, and tells the client how many once it resumes.  A real node run
here under Trio, and a client speaking the protocol itself, so that it can be away for
exactly as long as the test says."""

from __future__ import annotations

from pathlib import Path

import trio
from test_node import make_config, running_node

from cluster.protocol import EGRESS, PROTOCOL_VERSION, FrameDecoder, encode_frame
from cluster.protocol.egress import NewLeaderEvent, RepliesDropped, SessionEvent
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


async def test_replies_dropped_while_away_are_counted_and_told(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_node(make_config(tmp_path), Broadcast()) as node:
            port = node.ingress_port
            away, granted = await open_raw(port, 1)
            other, other_ok = await open_raw(port, 2)
            term, sid = granted.leadership_term_id, granted.cluster_session_id
            await away.stream.aclose()  # gone, the session open
            await trio.sleep(0.2)  # the node notices
            for i in range(3):
                await other.send(
                    SessionMessageHeader(term, other_ok.cluster_session_id, 0, b"%d" % i)
                )
            await other.until(SessionMessageHeader, 3)  # sent: to it, and dropped for us
            back = await RawSession.dial(port)
            await back.send(SessionResumeRequest(3, sid, PROTOCOL_VERSION, granted.session_secret))
            (told,) = await back.until(RepliesDropped)
            assert isinstance(told, RepliesDropped)
            assert (told.cluster_session_id, told.count) == (sid, 3)
            # after the leader's word that it took the resume
            assert any(isinstance(m, NewLeaderEvent) for m in back.received)
            # and what is sent now arrives
            await other.send(SessionMessageHeader(term, other_ok.cluster_session_id, 0, b"x"))
            (reply,) = await back.until(SessionMessageHeader)
            assert isinstance(reply, SessionMessageHeader)
            assert reply.payload == b"x"
            assert len(await back.until(RepliesDropped)) == 1  # told once
            await back.stream.aclose()
            await other.stream.aclose()
