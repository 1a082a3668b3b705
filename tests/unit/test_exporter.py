"""`/health`'s verdict from a member's status (issue #21)."""

from __future__ import annotations

import pytest
import trio

from cluster.agents.exporter import MAX_REQUEST, MetricsServer, health
from cluster.protocol.admin import MemberStatus


@pytest.mark.parametrize(
    ("role", "state", "leader", "heard", "ok"),
    [
        ("LEADER", "ACTIVE", 0, True, True),
        ("LEADER", "SNAPSHOT", 0, True, False),  # issue 31: healthy only when ACTIVE
        ("LEADER", "SUSPENDED", 0, True, False),  # issue 31: takes no writes
        ("LEADER", "ACTIVE", 0, False, False),  # no quorum heard from
        ("LEADER", "QUITTING", 0, True, False),
        ("FOLLOWER", "ACTIVE", 1, True, True),
        ("FOLLOWER", "ACTIVE", 1, False, False),  # its leader went silent
        ("FOLLOWER", "ACTIVE", -1, True, False),
        ("CANDIDATE", "ACTIVE", -1, False, False),
    ],
)
def test_health_says_whether_a_leader_with_a_quorum_is_seen(
    role: str, state: str, leader: int, heard: bool, ok: bool
) -> None:
    status = MemberStatus(member_id=0, role=role, module_state=state, leader_member_id=leader)
    verdict, reason = health(status, heard)
    assert verdict is ok
    assert reason


async def _serve(nursery: trio.Nursery) -> tuple[MetricsServer, int]:
    server = MetricsServer("127.0.0.1", 0, lambda: MemberStatus(member_id=3), lambda: False)
    port = await nursery.start(server.run)
    return server, port


async def _exchange(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        reply = b""
        try:
            await stream.send_all(data)
            with trio.fail_after(10):
                while chunk := await stream.receive_some(65536):
                    reply += chunk
        except trio.BrokenResourceError:  # closed on us with bytes unread: a reset
            pass
        return reply


async def test_a_strangers_bytes_on_the_metrics_port_get_an_error_or_a_close() -> None:
    async with trio.open_nursery() as nursery:
        server, port = await _serve(nursery)
        ok = await _exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200 OK")
        assert b'triarch_leadership_term{member="3"} -1.0' in ok
        sick = await _exchange(port, b"GET /health HTTP/1.1\r\n\r\n")
        assert sick.startswith(b"HTTP/1.1 503")
        assert b'"health": false' in sick
        assert (await _exchange(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(
            b"HTTP/1.1 405"
        )
        assert (await _exchange(port, b"\x00\xff garbage\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await _exchange(port, b"GET /x\r\n\r\n")).startswith(b"HTTP/1.1 404")
        # a request line that never ends: closed after 8 KiB, no answer
        assert await _exchange(port, b"G" * (MAX_REQUEST + 4096)) == b""
        nursery.cancel_scope.cancel()
    assert server.requests == 5
